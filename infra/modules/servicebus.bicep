// Service Bus Standard (Basic has no duplicate detection) with local (SAS) auth off, and
// the orders queue with send-side duplicate detection. Detection only reduces duplicates
// inside its window; the consumer's dedup markers handle the rest. The other entities exist
// only when main.bicep asks for them: your own queues, and each recipe's when it is on.
param name string
param location string
param tags object
param lockDuration string
param maxDeliveryCount int
param messageTimeToLive string
param duplicateDetectionWindow string
@description('Premium and private endpoints only (vnetEnabled): only Premium namespaces take private endpoints.')
param privateOnly bool = false
@description('Plain queues besides orders, with its settings: your own consumers\', the batch recipe\'s ledger and the balances recipe\'s balances.')
param queues array = []
@description('sessions recipe: the session-enabled order-status queue.')
param sessionQueue bool = false
@description('topic or outbox recipe: the order-events topic.')
param orderTopic bool = false
@description('topic recipe: the order topic\'s subscriptions (billing, shipping).')
param topicSubscriptions array = []

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
resource orderStatus 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = if (sessionQueue) {
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

// Your consumers' queues, ledger (the batch trigger) with the batch recipe, balances with the balances recipe.
resource moreQueues 'Microsoft.ServiceBus/namespaces/queues@2024-01-01' = [for name in queues: {
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
// track completion under their own consumer name in the shared dedup store. The outbox
// recipe publishes OrderAccepted here (the topic without subscriptions if topic is off).
resource orderEvents 'Microsoft.ServiceBus/namespaces/topics@2024-01-01' = if (orderTopic) {
  parent: namespace
  name: 'order-events'
  properties: {
    requiresDuplicateDetection: true
    duplicateDetectionHistoryTimeWindow: duplicateDetectionWindow
    defaultMessageTimeToLive: messageTimeToLive
  }
}

resource subscriptions 'Microsoft.ServiceBus/namespaces/topics/subscriptions@2024-01-01' = [for name in topicSubscriptions: {
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
output statusQueueName string = sessionQueue ? orderStatus.name : ''
output topicName string = orderTopic ? orderEvents.name : ''
