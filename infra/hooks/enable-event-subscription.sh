#!/bin/sh
# azd postdeploy hook: each Event Grid subscription targets a function, which exists only
# once the code is deployed. Provision once more with the subscriptions enabled.
set -eu
if [ "$(azd env get-value DEPLOY_EVENT_SUBSCRIPTION 2>/dev/null || true)" != "true" ]; then
  azd env set DEPLOY_EVENT_SUBSCRIPTION true
  azd provision --no-prompt
fi

# The blob-import recipe: the storage account's system topic delivers BlobCreated events to the
# blob trigger's webhook, whose URL carries the Storage Blobs extension's system key. It is read
# and used here, at deploy time, and never kept in a template (infra/README.md, Recipes).
topic="$(azd env get-value IMPORTS_SYSTEM_TOPIC 2>/dev/null || true)"
if [ -n "$topic" ]; then
  group="$(azd env get-value AZURE_RESOURCE_GROUP)"
  app="$(azd env get-value AZURE_FUNCTION_APP_NAME)"
  container="$(azd env get-value IMPORTS_CONTAINER)"
  account="$(az eventgrid system-topic show -g "$group" -n "$topic" --query source -o tsv)"
  key=""
  for _ in 1 2 3 4 5 6 7 8 9 10 11 12; do # the key exists once the host has started with the function
    key="$(az functionapp keys list -g "$group" -n "$app" --query systemKeys.blobs_extension -o tsv 2>/dev/null || true)"
    [ -n "$key" ] && break
    sleep 10
  done
  [ -n "$key" ] || { echo "no blobs_extension key on $app: is price_import deployed?" >&2; exit 1; }
  host="$(az functionapp show -g "$group" -n "$app" --query defaultHostName -o tsv)"
  az eventgrid system-topic event-subscription create -g "$group" --system-topic-name "$topic" -n imports \
    --endpoint "https://$host/runtime/webhooks/blobs?functionName=Host.Functions.price_import&code=$key" \
    --event-delivery-schema eventgridschema --included-event-types Microsoft.Storage.BlobCreated \
    --subject-begins-with "/blobServices/default/containers/$container/" \
    --max-delivery-attempts 30 --event-ttl 1440 \
    --deadletter-identity systemassigned \
    --deadletter-identity-endpoint "$account/blobServices/default/containers/$(azd env get-value EVENT_DEAD_LETTER_CONTAINER)" \
    --output none
fi
