// Function app on Flex Consumption, Python 3.12 or 3.13, running as the user-assigned identity.
// Every connection is identity-based: no connection strings, no keys.
param name string
param location string
param tags object
param identityId string
param identityClientId string
param storageAccountName string
param deploymentContainerUrl string
param appInsightsConnectionString string
@description('App settings of the template (README, Configuration).')
param appSettings object
@description('Optional client id of an Entra ID app registration: Easy Auth then requires its token on every HTTP route (401 without), and the caller scope of Idempotency-Keys is the token\'s principal, so a function-key rotation never turns a retry into a new request.')
param easyAuthClientId string = ''
@description('vnetEnabled: the app\'s outbound traffic through this subnet (delegated to Microsoft.App/environments).')
param subnetId string = ''
@allowed(['3.12', '3.13'])
param pythonVersion string = '3.13'

var baseSettings = {
  AzureWebJobsStorage__accountName: storageAccountName
  AzureWebJobsStorage__credential: 'managedidentity'
  AzureWebJobsStorage__clientId: identityClientId
  AZURE_CLIENT_ID: identityClientId // DefaultAzureCredential picks this identity
  APPLICATIONINSIGHTS_CONNECTION_STRING: appInsightsConnectionString
  APPLICATIONINSIGHTS_AUTHENTICATION_STRING: 'ClientId=${identityClientId};Authorization=AAD'
  PYTHON_ISOLATE_WORKER_DEPENDENCIES: '1'
  // OpenTelemetry as Microsoft documents it for Python (host.json "telemetryMode"): the worker
  // configures the Azure Monitor distro itself, Entra ID ingestion through the authentication
  // string above; the app never calls configure_azure_monitor, so there is one telemetry stream.
  // Workers read one name or the other (4.x up to 4.34: PYTHON_ENABLE_OPENTELEMETRY).
  PYTHON_APPLICATIONINSIGHTS_ENABLE_TELEMETRY: 'true'
  PYTHON_ENABLE_OPENTELEMETRY: 'true'
}

resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  // checkov:skip=CKV_AZURE_225: zone redundancy is not offered in every Flex Consumption region allowed
  name: 'plan-${name}'
  location: location
  tags: tags
  kind: 'functionapp'
  sku: { tier: 'FlexConsumption', name: 'FC1' }
  properties: { reserved: true }
}

resource app 'Microsoft.Web/sites@2024-04-01' = {
  // checkov:skip=CKV_AZURE_222: inbound HTTP stays public (keys or Easy Auth) so that Event Grid delivers; vnetEnabled routes outbound
  // checkov:skip=CKV_AZURE_17: callers authenticate with function keys or Entra ID tokens (Easy Auth), not client certificates
  // checkov:skip=CKV_AZURE_212: Flex Consumption scales instances on demand; always-ready instances are a cost choice
  // checkov:skip=CKV_AZURE_213: no App Service health check on Flex Consumption: the platform watches the Functions host
  name: name
  location: location
  tags: union(tags, { 'azd-service-name': 'api' })
  kind: 'functionapp,linux'
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: { '${identityId}': {} }
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    virtualNetworkSubnetId: empty(subnetId) ? null : subnetId
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
      http20Enabled: true
    }
    functionAppConfig: {
      deployment: {
        storage: {
          type: 'blobContainer'
          value: deploymentContainerUrl
          authentication: {
            type: 'UserAssignedIdentity'
            userAssignedIdentityResourceId: identityId
          }
        }
      }
      scaleAndConcurrency: {
        maximumInstanceCount: 100
        instanceMemoryMB: 2048
      }
      runtime: { name: 'python', version: pythonVersion }
    }
  }

  resource settings 'config' = {
    // checkov:skip=CKV_AZURE_13: a sites/config child (app settings or Easy Auth), which checkov reads as a whole web app
    // checkov:skip=CKV_AZURE_63: a sites/config child (app settings or Easy Auth), which checkov reads as a whole web app
    // checkov:skip=CKV_AZURE_65: a sites/config child (app settings or Easy Auth), which checkov reads as a whole web app
    // checkov:skip=CKV_AZURE_66: a sites/config child (app settings or Easy Auth), which checkov reads as a whole web app
    // checkov:skip=CKV_AZURE_80: a sites/config child (app settings or Easy Auth), which checkov reads as a whole web app
    // checkov:skip=CKV_AZURE_88: a sites/config child (app settings or Easy Auth), which checkov reads as a whole web app
    // checkov:skip=CKV_AZURE_222: a sites/config child (app settings or Easy Auth), which checkov reads as a whole web app
    name: 'appsettings'
    properties: union(baseSettings, appSettings)
  }
}

// No FTP or SCM basic-auth publishing: deployments authenticate with Entra ID.
resource ftpCredentials 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: app
  name: 'ftp'
  properties: { allow: false }
}

resource scmCredentials 'Microsoft.Web/sites/basicPublishingCredentialsPolicies@2024-04-01' = {
  parent: app
  name: 'scm'
  properties: { allow: false }
}

output name string = app.name
output id string = app.id

// Easy Auth (optional): the platform validates Entra ID tokens before the function runs and
// strips any client-sent principal header. Event Grid's webhook keeps its system-key auth.
resource auth 'Microsoft.Web/sites/config@2024-04-01' = if (!empty(easyAuthClientId)) {
  // checkov:skip=CKV_AZURE_13: a sites/config child (app settings or Easy Auth), which checkov reads as a whole web app
  // checkov:skip=CKV_AZURE_63: a sites/config child (app settings or Easy Auth), which checkov reads as a whole web app
  // checkov:skip=CKV_AZURE_65: a sites/config child (app settings or Easy Auth), which checkov reads as a whole web app
  // checkov:skip=CKV_AZURE_66: a sites/config child (app settings or Easy Auth), which checkov reads as a whole web app
  // checkov:skip=CKV_AZURE_80: a sites/config child (app settings or Easy Auth), which checkov reads as a whole web app
  // checkov:skip=CKV_AZURE_88: a sites/config child (app settings or Easy Auth), which checkov reads as a whole web app
  // checkov:skip=CKV_AZURE_222: a sites/config child (app settings or Easy Auth), which checkov reads as a whole web app
  parent: app
  name: 'authsettingsV2'
  properties: {
    platform: { enabled: true }
    globalValidation: {
      requireAuthentication: true
      unauthenticatedClientAction: 'Return401'
      excludedPaths: ['/runtime/webhooks/eventgrid']
    }
    identityProviders: {
      azureActiveDirectory: {
        enabled: true
        registration: {
          clientId: easyAuthClientId
          openIdIssuer: '${environment().authentication.loginEndpoint}${tenant().tenantId}/v2.0'
        }
        validation: { allowedAudiences: ['api://${easyAuthClientId}', easyAuthClientId] }
      }
    }
    login: { tokenStore: { enabled: false } }
  }
  dependsOn: [app::settings] // two writes to one site's config at once can conflict (409)
}
