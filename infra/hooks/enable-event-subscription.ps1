# azd postdeploy hook (Windows): see enable-event-subscription.sh.
$ErrorActionPreference = 'Stop'
$current = azd env get-value DEPLOY_EVENT_SUBSCRIPTION 2>$null
if ($current -ne 'true') {
  azd env set DEPLOY_EVENT_SUBSCRIPTION true
  azd provision --no-prompt
}

# The blob-import recipe: see enable-event-subscription.sh (the webhook's key is never kept in a template).
$topic = azd env get-value IMPORTS_SYSTEM_TOPIC 2>$null
if ($LASTEXITCODE -eq 0 -and $topic) {
  $group = azd env get-value AZURE_RESOURCE_GROUP
  $app = azd env get-value AZURE_FUNCTION_APP_NAME
  $container = azd env get-value IMPORTS_CONTAINER
  $account = az eventgrid system-topic show -g $group -n $topic --query source -o tsv
  $key = ''
  foreach ($try in 1..12) {  # the key exists once the host has started with the function
    $key = az functionapp keys list -g $group -n $app --query systemKeys.blobs_extension -o tsv 2>$null
    if ($key) { break }
    Start-Sleep -Seconds 10
  }
  if (-not $key) { throw "no blobs_extension key on ${app}: is price_import deployed?" }
  $hostName = az functionapp show -g $group -n $app --query defaultHostName -o tsv
  $deadLetters = azd env get-value EVENT_DEAD_LETTER_CONTAINER
  az eventgrid system-topic event-subscription create -g $group --system-topic-name $topic -n imports `
    --endpoint "https://$hostName/runtime/webhooks/blobs?functionName=Host.Functions.price_import&code=$key" `
    --event-delivery-schema eventgridschema --included-event-types Microsoft.Storage.BlobCreated `
    --subject-begins-with "/blobServices/default/containers/$container/" `
    --max-delivery-attempts 30 --event-ttl 1440 `
    --deadletter-identity systemassigned `
    --deadletter-identity-endpoint "$account/blobServices/default/containers/$deadLetters" `
    --output none
}
