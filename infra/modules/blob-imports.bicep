// The blob-import recipe (main.bicep deploys it only then): the imports container in the app's
// storage account, and the account's Event Grid system topic, which delivers BlobCreated events
// to the blob trigger (source EventGrid: what Flex Consumption supports). The subscription's
// endpoint is the Storage Blobs extension's webhook, whose URL carries the extension's system
// key: azd's postdeploy hook (infra/hooks/) creates it once the function exists, so that no
// template ever holds a key. The app's identity reads the blobs with the host's role on this
// account, and uses the host's blob-trigger queues with Storage Queue Data Contributor (roles.bicep).
param storageAccountName string
param location string
param tags object
@description('The container whose new blobs are imported.')
param container string
@description('Where the system topic dead-letters what it could not deliver (its identity may write there only).')
param deadLetterContainer string

var storageBlobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: account
  name: 'default'
}

resource imports 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: container
  properties: { publicAccess: 'None' }
}

resource systemTopic 'Microsoft.EventGrid/systemTopics@2022-06-15' = {
  name: '${storageAccountName}-blobs'
  location: location
  tags: tags
  identity: { type: 'SystemAssigned' }
  properties: {
    source: account.id
    topicType: 'Microsoft.Storage.StorageAccounts'
  }
}

resource deadLetters 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: deadLetterContainer
}

resource deadLetterWriter 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(deadLetters.id, systemTopic.id, storageBlobDataContributor)
  scope: deadLetters
  properties: {
    principalId: systemTopic.identity.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
  }
}

output container string = imports.name
output systemTopicName string = systemTopic.name
output blobServiceUri string = account.properties.primaryEndpoints.blob
output queueServiceUri string = account.properties.primaryEndpoints.queue
