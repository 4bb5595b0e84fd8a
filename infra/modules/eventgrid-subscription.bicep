// Delivers the topic's CloudEvents of `eventTypes` to one function, with retries and
// dead-lettering to blob: one module call per subscriber. Deployed once the function exists
// (azd postdeploy hook).
param name string
param eventTypes array
param topicName string
param functionAppName string
param functionName string
param storageAccountName string
param deadLetterContainer string
param eventTimeToLiveInMinutes int
param maxDeliveryAttempts int

resource topic 'Microsoft.EventGrid/topics@2022-06-15' existing = {
  name: topicName
}

resource functionApp 'Microsoft.Web/sites@2024-04-01' existing = {
  name: functionAppName
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource subscription 'Microsoft.EventGrid/topics/eventSubscriptions@2022-06-15' = {
  parent: topic
  name: name
  properties: {
    eventDeliverySchema: 'CloudEventSchemaV1_0'
    destination: {
      endpointType: 'AzureFunction'
      properties: {
        resourceId: '${functionApp.id}/functions/${functionName}'
        maxEventsPerBatch: 1
      }
    }
    filter: { includedEventTypes: concat(eventTypes, ['dedup.canary']) } // and the app's canary (canary.py)
    retryPolicy: {
      maxDeliveryAttempts: maxDeliveryAttempts
      eventTimeToLiveInMinutes: eventTimeToLiveInMinutes
    }
    deadLetterWithResourceIdentity: {
      identity: { type: 'SystemAssigned' }
      deadLetterDestination: {
        endpointType: 'StorageBlob'
        properties: {
          resourceId: storage.id
          blobContainerName: deadLetterContainer
        }
      }
    }
  }
}
