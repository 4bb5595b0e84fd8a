// The Storage queues the app consumes (main.bicep's appStorageQueues and the queue recipe's;
// deployed only when there is one), in its own storage account, each with the `<queue>-poison` queue the Functions host moves a
// message to after host.json's maxDequeueCount dequeues (created here: the host would need
// the right to create queues otherwise).
param storageAccountName string
@description('The queues the app consumes (queue triggers).')
param queues array

resource account 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource queueService 'Microsoft.Storage/storageAccounts/queueServices@2023-05-01' = {
  parent: account
  name: 'default'
}

resource consumed 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [for queue in queues: {
  parent: queueService
  name: queue
}]

resource poison 'Microsoft.Storage/storageAccounts/queueServices/queues@2023-05-01' = [for queue in queues: {
  parent: queueService
  name: '${queue}-poison'
}]

output queueServiceUri string = account.properties.primaryEndpoints.queue
