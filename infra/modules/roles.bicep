// Least privilege for the app's identity, each role scoped to one resource (never the
// subscription or the resource group).
param principalId string
param storageAccountName string
param serviceBusName string
param appInsightsName string
@description('Empty when the dedup store is Table Storage.')
param cosmosAccountName string
param eventGridTopicName string
param eventGridPrincipalId string
@description('The blob container where Event Grid dead-letters events: its identity may write there only.')
param eventDeadLetterContainer string
@description('Optional operator (the deploying user under azd, or a pipeline) for the smoke test: may send to and peek the orders queue, publish to the topic and read the records table or container; nothing else.')
param operatorPrincipalId string
@description('The orders queue: the app receives from it, the smoke test sends to it.')
param ordersQueueName string
@description('The other queues the app receives from (your consumers\', the batch and sessions recipes\').')
param receiveQueues array = []
@description('topic or outbox recipe: the order topic (empty: none).')
param orderTopicName string = ''
@description('topic recipe: the order topic\'s subscriptions the app receives from.')
param topicSubscriptions array = []
@description('outbox recipe: the app sends OrderAccepted to the order topic.')
param outbox bool = false
@description('eventhubs recipe: the namespace and its hub (empty: none).')
param eventHubsName string = ''
param shipmentHubName string = ''
@description('The table (or Cosmos container) holding business records and markers.')
param recordsName string
@description('queue recipe: the Storage queues the app consumes (each with its <queue>-poison).')
param storageQueues array = []
@description('blob-import recipe: a blob trigger, whose queues the host keeps in the account.')
param blobTrigger bool = false

var roleIds = {
  serviceBusDataReceiver: '4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0'
  eventHubsDataReceiver: 'a638d3c7-ab3a-418d-83e6-5f17a39d4fde'
  serviceBusDataSender: '69a216fc-b8fb-44d8-bc22-1f3c2cd27a39'
  storageBlobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  storageBlobDataContributor: 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'
  storageTableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
  storageQueueDataContributor: '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
  storageQueueDataReader: '19e7f393-937e-4f77-808e-94535e297925'
  storageQueueDataMessageProcessor: '8a0f0c08-91a1-4084-bc3d-661d67233fed'
  storageQueueDataMessageSender: 'c6a89b2d-59bc-44d0-9896-0f6e12d7b80a'
  monitoringMetricsPublisher: '3913510d-42f4-4e42-8a64-420c390055eb'
  eventGridDataSender: 'd5a91429-5739-47e2-a06b-3470a27159e7'
  storageTableDataReader: '76199698-9eea-4c19-bc75-cec21354c6b6'
}
var cosmosDatabase = 'dedup'
var cosmosDataReader = '00000000-0000-0000-0000-000000000001'
var cosmosDataContributor = '00000000-0000-0000-0000-000000000002'

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource serviceBus 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusName
}

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

resource topic 'Microsoft.EventGrid/topics@2022-06-15' existing = {
  name: eventGridTopicName
}

resource ordersQueue 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = {
  parent: serviceBus
  name: ordersQueueName
}

resource queues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' existing = [for name in receiveQueues: {
  parent: serviceBus
  name: name
}]

resource orderEventsTopic 'Microsoft.ServiceBus/namespaces/topics@2024-01-01' existing = if (!empty(orderTopicName)) {
  parent: serviceBus
  name: orderTopicName
}

resource subscriptions 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2024-01-01' existing = [for name in topicSubscriptions: {
  parent: orderEventsTopic
  name: name
}]

resource eventHubs 'Microsoft.EventHub/namespaces@2024-01-01' existing = if (!empty(eventHubsName)) {
  name: eventHubsName
}

resource shipmentHub 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' existing = if (!empty(shipmentHubName)) {
  parent: eventHubs
  name: shipmentHubName
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource consumedQueues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' existing = [for name in storageQueues: {
  parent: queueService
  name: name
}]

resource poisonQueues 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' existing = [for name in storageQueues: {
  parent: queueService
  name: '${name}-poison'
}]

resource recordsTable 'Microsoft.Storage/storageAccounts/tableServices/tables@2023-05-01' existing = {
  name: '${storageAccountName}/default/${recordsName}'
}

// The app receives from each queue and subscription it consumes, never the whole namespace.
resource receiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(ordersQueue.id, principalId, roleIds.serviceBusDataReceiver)
  scope: ordersQueue
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.serviceBusDataReceiver)
  }
}

resource queueReceivers 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in receiveQueues: {
  name: guid(queues[i].id, principalId, roleIds.serviceBusDataReceiver)
  scope: queues[i]
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.serviceBusDataReceiver)
  }
}]

resource subscriptionReceivers 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in topicSubscriptions: {
  name: guid(subscriptions[i].id, principalId, roleIds.serviceBusDataReceiver)
  scope: subscriptions[i]
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.serviceBusDataReceiver)
  }
}]

// The order topic: the outbox publishes OrderAccepted there, and the canary timer sends its
// canary through it to the subscriptions the app reads. One assignment for both.
resource orderTopicSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (outbox || !empty(topicSubscriptions)) {
  name: guid(orderEventsTopic.id, principalId, roleIds.serviceBusDataSender)
  scope: orderEventsTopic
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.serviceBusDataSender)
  }
}

// The canary timer (send_canaries) sends through each queue the app receives from: Data Sender
// on each of those queues, nowhere else.
resource canarySender 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(ordersQueue.id, principalId, roleIds.serviceBusDataSender)
  scope: ordersQueue
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.serviceBusDataSender)
  }
}

resource queueCanarySenders 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in receiveQueues: {
  name: guid(queues[i].id, principalId, roleIds.serviceBusDataSender)
  scope: queues[i]
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.serviceBusDataSender)
  }
}]

// The canary timer publishes its CloudEvent to the app's Event Grid topic, and nowhere else.
resource canaryPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(topic.id, principalId, roleIds.eventGridDataSender)
  scope: topic
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.eventGridDataSender)
  }
}

// The shipment stream: receive from that hub only (checkpoints go to the app's own blobs).
resource hubReceiver 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(shipmentHubName)) {
  name: guid(shipmentHub.id, principalId, roleIds.eventHubsDataReceiver)
  scope: shipmentHub
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.eventHubsDataReceiver)
  }
}

// The Functions host (AzureWebJobsStorage) and the deployment package live in blobs.
resource blobOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, principalId, roleIds.storageBlobDataOwner)
  scope: storage
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.storageBlobDataOwner)
  }
}

// A blob trigger's queues (the host's blob-trigger queue and webjobs-blobtrigger-poison) live
// in the account: the one queue role on the whole account, and only with a blob trigger.
resource queueContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (blobTrigger) {
  name: guid(storage.id, principalId, roleIds.storageQueueDataContributor)
  scope: storage
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.storageQueueDataContributor)
  }
}

// A queue trigger reads and processes (gets, updates, deletes) the messages of its queue, and
// adds the ones it gives up on to its poison queue: each role on the one queue.
resource storageQueueReaders 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in storageQueues: {
  name: guid(consumedQueues[i].id, principalId, roleIds.storageQueueDataReader)
  scope: consumedQueues[i]
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.storageQueueDataReader)
  }
}]

resource storageQueueProcessors 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in storageQueues: {
  name: guid(consumedQueues[i].id, principalId, roleIds.storageQueueDataMessageProcessor)
  scope: consumedQueues[i]
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.storageQueueDataMessageProcessor)
  }
}]

resource poisonSenders 'Microsoft.Authorization/roleAssignments@2022-04-01' = [for (name, i) in storageQueues: {
  name: guid(poisonQueues[i].id, principalId, roleIds.storageQueueDataMessageSender)
  scope: poisonQueues[i]
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.storageQueueDataMessageSender)
  }
}]

resource tableContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, principalId, roleIds.storageTableDataContributor)
  scope: storage
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.storageTableDataContributor)
  }
}

resource metricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, principalId, roleIds.monitoringMetricsPublisher)
  scope: appInsights
  properties: {
    principalId: principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.monitoringMetricsPublisher)
  }
}

resource deadLetterContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  name: '${storageAccountName}/default/${eventDeadLetterContainer}'
}

// Event Grid's own identity writes undeliverable events to the dead-letter container, and
// nowhere else (the account also holds the deployment package).
resource eventGridDeadLetters 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(deadLetterContainer.id, eventGridPrincipalId, roleIds.storageBlobDataContributor)
  scope: deadLetterContainer
  properties: {
    principalId: eventGridPrincipalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.storageBlobDataContributor)
  }
}

resource cosmos 'Microsoft.DocumentDB/databaseAccounts@2024-11-15' existing = if (!empty(cosmosAccountName)) {
  name: cosmosAccountName
}

// Cosmos DB Built-in Data Contributor (a data-plane SQL role), scoped to the app's database.
resource cosmosContributor 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-11-15' = if (!empty(cosmosAccountName)) {
  parent: cosmos
  name: guid(cosmosAccountName, principalId, 'cosmos-data-contributor')
  properties: {
    principalId: principalId
    roleDefinitionId: '${cosmos.id}/sqlRoleDefinitions/${cosmosDataContributor}'
    scope: '${cosmos.id}/dbs/${cosmosDatabase}'
  }
}

// The operator: each role on the one resource the smoke test touches. Peeking the queue's
// dead letters needs the receiver role (Service Bus has no peek-only role): on this queue only.
// Refused messages' records (full bodies) stay out of reach.
resource queueSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId)) {
  name: guid(ordersQueue.id, operatorPrincipalId, roleIds.serviceBusDataSender)
  scope: ordersQueue
  properties: {
    principalId: operatorPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.serviceBusDataSender)
  }
}

resource queuePeeker 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId)) {
  name: guid(ordersQueue.id, operatorPrincipalId, roleIds.serviceBusDataReceiver)
  scope: ordersQueue
  properties: {
    principalId: operatorPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.serviceBusDataReceiver)
  }
}

resource topicSender 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId)) {
  name: guid(topic.id, operatorPrincipalId, roleIds.eventGridDataSender)
  scope: topic
  properties: {
    principalId: operatorPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.eventGridDataSender)
  }
}

resource tableReader 'Microsoft.Authorization/roleAssignments@2022-04-01' = if (!empty(operatorPrincipalId) && empty(cosmosAccountName)) {
  name: guid(recordsTable.id, operatorPrincipalId, roleIds.storageTableDataReader)
  scope: recordsTable
  properties: {
    principalId: operatorPrincipalId
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.storageTableDataReader)
  }
}

resource cosmosReader 'Microsoft.DocumentDB/databaseAccounts/sqlRoleAssignments@2024-11-15' = if (!empty(operatorPrincipalId) && !empty(cosmosAccountName)) {
  parent: cosmos
  name: guid(cosmosAccountName, operatorPrincipalId, 'cosmos-data-reader')
  properties: {
    principalId: operatorPrincipalId
    roleDefinitionId: '${cosmos.id}/sqlRoleDefinitions/${cosmosDataReader}'
    scope: '${cosmos.id}/dbs/${cosmosDatabase}/colls/${recordsName}'
  }
}
