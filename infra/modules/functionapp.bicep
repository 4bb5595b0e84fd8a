// Function app on Flex Consumption, Python 3.11, running as the user-assigned identity.
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
  name: 'plan-${name}'
  location: location
  tags: tags
  kind: 'functionapp'
  sku: { tier: 'FlexConsumption', name: 'FC1' }
  properties: { reserved: true }
}

resource app 'Microsoft.Web/sites@2024-04-01' = {
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
    siteConfig: {
      minTlsVersion: '1.2'
      ftpsState: 'Disabled'
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
      runtime: { name: 'python', version: '3.11' }
    }
  }

  resource settings 'config' = {
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
