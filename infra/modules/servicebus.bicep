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
@description('Premium and private endpoints only (vnetEnabled): only Premium namespaces take private endpoints.')
param privateOnly bool = false

resource namespace 'Microsoft.ServiceBus/namespaces@2024-01-01' = {
  name: name
  location: location
  tags: tags
  sku: privateOnly ? { name: 'Premium', tier: 'Premium', capacity: 1 } : { name: 'Standard', tier: 'Standard' }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: privateOnly ? 'Disabled' : 'Enabled'
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

// order-status: event-carried state (versioned upserts), in order per order: a session per
// orderId (producers set SessionId), one receiver per session at a time, under a session lock.
resource orderStatus 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = {
  parent: namespace
  name: 'order-status'
  properties: {
    requiresSession: true
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
    lockDuration: lockDuration
    maxDeliveryCount: maxDeliveryCount
    defaultMessageTimeToLive: messageTimeToLive
    deadLetteringOnMessageExpiration: true
  }
}

// ledger: the batch trigger.
resource moreQueues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = [for name in ['ledger']: {
  parent: namespace
  name: name
  properties: {
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
    lockDuration: lockDuration
    maxDeliveryCount: maxDeliveryCount
    defaultMessageTimeToLive: messageTimeToLive
    deadLetteringOnMessageExpiration: true
  }
}]

// Publish-subscribe: every subscription gets its own copy; billing and shipping each
// track completion under their own consumer name in the shared dedup store.
resource orderEvents 'Microsoft.ServiceBus/namespaces/topics@2024-01-01' = {
  parent: namespace
  name: 'order-events'
  properties: {
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
    defaultMessageTimeToLive: messageTimeToLive
  }
}

resource subscriptions 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2024-01-01' = [for name in ['billing', 'shipping']: {
  parent: orderEvents
  name: name
  properties: {
    lockDuration: lockDuration
    maxDeliveryCount: maxDeliveryCount
    defaultMessageTimeToLive: messageTimeToLive
    deadLetteringOnMessageExpiration: true
  }
}]

output name string = namespace.name
output id string = namespace.id
output fullyQualifiedNamespace string = '${namespace.name}.servicebus.windows.net'
output queueName string = orders.name
output statusQueueName string = orderStatus.name
output ledgerQueueName string = moreQueues[0].name
output topicName string = orderEvents.name
