// Service Bus Standard (Basic has no duplicate detection) with local (SAS) auth off, and
// the orders queue with send-side duplicate detection. Detection only reduces duplicates
// inside its window; the consumer's dedup markers handle the rest.
param name string
param location string
param tags object
param lockDuration string
param maxDeliveryCount int
param messageTimeToLive string
param duplicateDetectionWindow string

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: name
  location: location
  tags: tags
  sku: { name: 'Standard', tier: 'Standard' }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
  }
}

resource orders 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = {
  parent: namespace
  name: 'orders'
  properties: {
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
    lockDuration: lockDuration
    maxDeliveryCount: maxDeliveryCount
    defaultMessageTimeToLive: messageTimeToLive
    deadLetteringOnMessageExpiration: true
  }
}

output name string = namespace.name
output fullyQualifiedNamespace string = '${namespace.name}.servicebus.windows.net'
output queueName string = orders.name
