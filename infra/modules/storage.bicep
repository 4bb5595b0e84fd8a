// Functions host storage, deployment package container, dedup tables and the Event Grid
// dead-letter container. Shared keys are disabled: identities only.
param name string
param location string
param tags object
@description('Refuse public network access (vnetEnabled: private endpoints only).')
param privateOnly bool = false

var deploymentContainer = 'app-package'
var eventDeadLetterContainer = 'eventgrid-deadletters'

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  // checkov:skip=CKV_AZURE_59: public network access stays Enabled for the trusted-services bypass (Event Grid dead letters); vnetEnabled denies by networkAcls
  // checkov:skip=CKV_AZURE_35: public endpoint by default, identity-only auth, keys off; vnetEnabled denies it (private endpoints)
  // checkov:skip=CKV_AZURE_206: LRS because ZRS is not offered in every Flex Consumption region allowed; choose ZRS where it is
  name: name
  location: location
  tags: tags
  kind: 'StorageV2'
  sku: { name: 'Standard_LRS' }
  properties: {
    allowSharedKeyAccess: false
    allowBlobPublicAccess: false
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
    defaultToOAuthAuthentication: true
    // vnetEnabled: deny by default, private endpoints for the app; public access stays 'Enabled' so
    // that the trusted-services bypass still lets Event Grid write its dead letters (identity).
    publicNetworkAccess: 'Enabled'
    networkAcls: { defaultAction: privateOnly ? 'Deny' : 'Allow', bypass: 'AzureServices' }
  }
}

resource blobs 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource packageContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobs
  name: deploymentContainer
  properties: { publicAccess: 'None' }
}

resource deadLetters 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobs
  name: eventDeadLetterContainer
  properties: { publicAccess: 'None' }
}

resource tables 'Microsoft.Storage/storageAccounts/tableServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource recordsTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tables
  name: 'records'
}

resource deadLetterTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' = {
  parent: tables
  name: 'deadletters'
}

output name string = account.name
output id string = account.id
output tableEndpoint string = account.properties.primaryEndpoints.table
output deploymentContainerUrl string = '${account.properties.primaryEndpoints.blob}${deploymentContainer}'
output eventDeadLetterContainer string = eventDeadLetterContainer
