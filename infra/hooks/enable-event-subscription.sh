#!/bin/sh
# azd postdeploy hook: each Event Grid subscription targets a function, which exists only
# once the code is deployed. Provision once more with the subscriptions enabled.
set -eu
if [ "$(azd env get-value DEPLOY_EVENT_SUBSCRIPTION 2>/dev/null || true)" != "true" ]; then
  azd env set DEPLOY_EVENT_SUBSCRIPTION true
  azd provision --no-prompt
fi
