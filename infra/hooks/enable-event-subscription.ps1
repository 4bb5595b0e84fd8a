# azd postdeploy hook (Windows): see enable-event-subscription.sh.
$ErrorActionPreference = 'Stop'
$current = azd env get-value DEPLOY_EVENT_SUBSCRIPTION 2>$null
if ($current -ne 'true') {
  azd env set DEPLOY_EVENT_SUBSCRIPTION true
  azd provision --no-prompt
}
