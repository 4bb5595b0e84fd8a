// Idempotent consumers on Azure Functions: everything the app needs, with managed
// identity only (no keys, no connection strings). Deploy with `azd up` (README, Deploy).
// The default app deploys what its Service Bus and Event Grid consumers need; each recipe
// named in infra/recipes.json adds its own resources, settings, roles and alerts
// (infra/README.md, Recipes).
// Without azd (infra/main.parameters.json holds azd placeholders, so pass values instead):
//   az deployment group create -g <rg> -f infra/main.bicep -p environmentName=<name> \
//     principalId=$(az ad signed-in-user show --query id -o tsv) [dedupStore=cosmos]
//   func azure functionapp publish <AZURE_FUNCTION_APP_NAME output> --python --build remote
//   then the same deployment again with deployEventSubscription=true.
targetScope = 'resourceGroup'

@description('Short environment name, used to derive resource names.')
@minLength(1)
@maxLength(20)
param environmentName string

@description('Region for every resource: one that offers Flex Consumption (az functionapp list-flexconsumption-locations).')
@allowed([
  'australiaeast'
  'australiasoutheast'
  'brazilsouth'
  'canadacentral'
  'centralindia'
  'centralus'
  'eastasia'
  'eastus'
  'eastus2'
  'francecentral'
  'germanywestcentral'
  'italynorth'
  'japaneast'
  'koreacentral'
  'northcentralus'
  'northeurope'
  'norwayeast'
  'southafricanorth'
  'southcentralus'
  'southeastasia'
  'southindia'
  'spaincentral'
  'swedencentral'
  'uaenorth'
  'uksouth'
  'ukwest'
  'westcentralus'
  'westeurope'
  'westus'
  'westus2'
  'westus3'
])
@metadata({ azd: { type: 'location' } })
param location string = resourceGroup().location

@description('Where dedup markers live: table (Azure Table Storage) or cosmos (Cosmos DB, serverless).')
@allowed(['table', 'cosmos'])
param dedupStore string = 'table'

@description('Days a dedup marker is kept (DEDUP_RETENTION, Cosmos defaultTtl). Must outlive every redelivery: make check-retention.')
@minValue(1)
param dedupRetentionDays int = 30

@description('Private networking: VNet integration of the app, private endpoints for storage, Service Bus (then Premium), Event Hubs (eventhubs recipe) and Cosmos DB, public access to them off. Off by default (cost: Premium Service Bus).')
param vnetEnabled bool = false

@description('The app\'s Python version on Flex Consumption: `azd env set PYTHON_VERSION 3.12`. Both are proven through their runtime (README, Python versions).')
@allowed(['3.12', '3.13'])
param pythonVersion string = '3.13'

@description('E-mail address the alerts are sent to (empty: they show in the portal only).')
param alertEmail string = ''

@description('The recipes switched on: the names in infra/recipes.json (`make recipe NAME=<name>` adds one; infra/README.md, Recipes). Not an azd variable: the file is the switch. A name not allowed here fails the deployment.')
@allowed(['topic', 'outbox', 'sessions', 'batch', 'eventhubs', 'http', 'cloudevents-http', 'schedule', 'payments', 'queue', 'blob-import', 'balances'])
param recipes array = loadJsonContent('recipes.json')

@description('payments recipe: the payment API the orders consumer charges through (PAYMENT_API_URL): `azd env set PAYMENT_API_URL <url>`.')
param paymentApiUrl string = ''

@description('eventhubs recipe: how long Event Hubs keeps events (Standard: 1-7 days): a replay from a checkpoint can bring them back until then.')
@minValue(1)
@maxValue(7)
param eventHubRetentionDays int = 7

@description('Service Bus peek-lock duration of the orders queue (ISO 8601, at most PT5M).')
param lockDuration string = 'PT1M'

@description('Deliveries before Service Bus dead-letters a message.')
@minValue(1)
param maxDeliveryCount int = 10

@description('Time a message may wait in the queue (ISO 8601).')
param messageTimeToLive string = 'P14D'

@description('Send-side duplicate detection window (ISO 8601, 20 seconds to 7 days).')
param duplicateDetectionWindow string = 'PT10M'

@description('Event Grid: minutes an event is retried before it is dead-lettered (at most 1440).')
@minValue(1)
@maxValue(1440)
param eventTimeToLiveInMinutes int = 1440

@description('Event Grid: delivery attempts before an event is dead-lettered (at most 30).')
@minValue(1)
@maxValue(30)
param eventMaxDeliveryAttempts int = 30

@description('Days operators may take to resubmit dead-lettered messages: the dead-letter records are kept as long (DEDUP_DEAD_LETTER_RETENTION), and check-retention adds it to the redelivery window.')
@minValue(1)
param deadLetterResubmitDays int = 14

@description('Create the Event Grid subscriptions. Each needs its function to exist, so azd sets it after the first deploy (postdeploy hook).')
param deployEventSubscription bool = false

@description('Optional Entra ID app registration (client id) for Easy Auth on the HTTP routes: `azd env set EASY_AUTH_CLIENT_ID <id>`. Empty: function keys only.')
param easyAuthClientId string = ''

@description('Optional operator (azd passes the deploying user, AZURE_PRINCIPAL_ID) for the smoke test: may send to and peek the orders queue, publish events and read the records table or container. Empty: no operator role.')
param principalId string = ''

// Resource name prefixes, as Microsoft's azd templates name them (infra/abbreviations.json).
var abbrs = loadJsonContent('abbreviations.json')

var suffix = uniqueString(resourceGroup().id, environmentName)
var tags = { 'azd-env-name': environmentName }

// What each recipe switches on (the names without resources, http, cloudevents-http and
// schedule, are code only). lab/infra_checks.py evaluates the conditions with the recipes:
// keep them plain names, or parenthesised (its parser binds `? :` tighter than `==` or `&&`).
var withTopic = contains(recipes, 'topic') // the order topic, its billing and shipping subscriptions
var withOutbox = contains(recipes, 'outbox') // the orders consumer publishes OrderAccepted to the order topic
var withOrderTopic = withTopic || withOutbox
var withSessions = contains(recipes, 'sessions') // the session-enabled order-status queue
var withBatch = contains(recipes, 'batch') // the ledger queue (batch trigger)
var withBalances = contains(recipes, 'balances') // the balances queue (entries changing a running balance)
var withEventHubs = contains(recipes, 'eventhubs') // the Event Hubs namespace and its shipments hub
var withPayments = contains(recipes, 'payments') // the payment API's URL (two-phase steps)
var withQueue = contains(recipes, 'queue') // the returns Storage queue and its poison queue
var withBlobImport = contains(recipes, 'blob-import') // the imports container and the storage account's system topic

// Plain Service Bus queues besides orders: your own consumers' queues (README, Start your own
// app), then the batch and balances recipes'. Each gets the orders queue's settings and a receive role.
var appQueues = []
var queues = concat(appQueues, withBatch ? ['ledger'] : [], withBalances ? ['balances'] : [])
var topicSubscriptions = withTopic ? ['billing', 'shipping'] : []
// Storage queues the app consumes (queue triggers): yours, then the queue recipe's. Each gets its
// <queue>-poison and the app's roles on both; the checks read host.json's extensions.queues for it.
var appStorageQueues = []
var storageQueueNames = concat(appStorageQueues, withQueue ? ['returns'] : [])
var withStorageQueues = !empty(storageQueueNames)

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  params: { name: '${abbrs.monitoring}${environmentName}-${suffix}', location: location, tags: tags }
}

module alerts 'modules/alerts.bicep' = {
  name: 'alerts'
  params: {
    location: location
    tags: tags
    appInsightsName: monitoring.outputs.appInsightsName
    serviceBusName: serviceBus.outputs.name
    eventGridTopicName: eventGrid.outputs.name
    alertEmail: alertEmail
    eventHubs: withEventHubs
    outbox: withOutbox
    steps: withPayments
    storagePoison: withStorageQueues || withBlobImport
  }
}

module identity 'modules/identity.bicep' = {
  name: 'identity'
  params: { name: '${abbrs.managedIdentityUserAssignedIdentities}${environmentName}-${suffix}', location: location, tags: tags }
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  params: { name: '${abbrs.storageStorageAccounts}${take(suffix, 20)}', location: location, tags: tags, privateOnly: vnetEnabled }
}

module serviceBus 'modules/servicebus.bicep' = {
  name: 'servicebus'
  params: {
    name: '${abbrs.serviceBusNamespaces}${environmentName}-${suffix}'
    location: location
    tags: tags
    lockDuration: lockDuration
    maxDeliveryCount: maxDeliveryCount
    messageTimeToLive: messageTimeToLive
    duplicateDetectionWindow: duplicateDetectionWindow
    privateOnly: vnetEnabled
    queues: queues
    sessionQueue: withSessions
    orderTopic: withOrderTopic
    topicSubscriptions: topicSubscriptions
  }
}

module storageQueues 'modules/storage-queues.bicep' = if (withStorageQueues) {
  name: 'storage-queues'
  params: { storageAccountName: storage.outputs.name, queues: storageQueueNames }
}

module blobImports 'modules/blob-imports.bicep' = if (withBlobImport) {
  name: 'blob-imports'
  params: {
    storageAccountName: storage.outputs.name
    location: location
    tags: tags
    container: 'imports'
    deadLetterContainer: storage.outputs.eventDeadLetterContainer
  }
}

module eventHubs 'modules/eventhubs.bicep' = if (withEventHubs) {
  name: 'eventhubs'
  params: {
    name: '${abbrs.eventHubNamespaces}${environmentName}-${suffix}'
    location: location
    tags: tags
    retentionDays: eventHubRetentionDays
    privateOnly: vnetEnabled
  }
}

module cosmos 'modules/cosmos.bicep' = if (dedupStore == 'cosmos') {
  name: 'cosmos'
  params: {
    name: '${abbrs.cosmosDBAccounts}${environmentName}-${suffix}'
    location: location
    tags: tags
    defaultTtlSeconds: dedupRetentionDays * 86400
    privateOnly: vnetEnabled
  }
}

module eventGrid 'modules/eventgrid.bicep' = {
  name: 'eventgrid'
  params: { name: '${abbrs.eventGridDomainsTopics}${environmentName}-${suffix}', location: location, tags: tags }
}

module network 'modules/network.bicep' = if (vnetEnabled) {
  name: 'network'
  params: {
    name: '${abbrs.networkVirtualNetworks}${environmentName}-${suffix}'
    location: location
    tags: tags
    storageAccountId: storage.outputs.id
    serviceBusId: serviceBus.outputs.id
    eventHubsId: withEventHubs ? eventHubs.outputs.id : ''
    cosmosAccountId: (dedupStore == 'cosmos') ? cosmos.outputs.id : ''
  }
}

// The app settings of the default app (README, Configuration); each recipe adds its own below.
var settings = {
  ServiceBusConnection__fullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
  ServiceBusConnection__credential: 'managedidentity'
  ServiceBusConnection__clientId: identity.outputs.clientId
  ORDERS_QUEUE: serviceBus.outputs.queueName
  DEDUP_STORE: dedupStore
  EVENTGRID_TOPIC_ENDPOINT: eventGrid.outputs.endpoint // the canary's Event Grid topic (send_canaries)
  DEDUP_STORAGE_ENDPOINT: storage.outputs.tableEndpoint
  DEDUP_RETENTION: 'P${dedupRetentionDays}D'
  DEDUP_DEAD_LETTER_RETENTION: 'P${deadLetterResubmitDays}D'
  DEDUP_MAX_DELIVERY_COUNT: '${maxDeliveryCount}' // the last delivery records why before the broker dead-letters
  // The outbox refuses, before its commit, a message larger than its destination takes:
  // Standard's 256 KiB, a Premium entity's 1 MiB (its default maxMessageSizeInKilobytes).
  DEDUP_OUTGOING_MAX_BYTES: vnetEnabled ? '1048576' : '262144'
  // Sync functions run on the worker's thread pool (min(32, CPUs + 4) threads by default): every
  // call that waits out a store outage holds one (make check-leases counts them).
  PYTHON_THREADPOOL_THREAD_COUNT: '256'
  COSMOS_ENDPOINT: (dedupStore == 'cosmos') ? cosmos.outputs.endpoint : ''
  COSMOS_DATABASE: 'dedup'
  COSMOS_CONTAINER: 'records'
  COSMOS_DEADLETTER_CONTAINER: 'deadletters'
}
var topicSettings = withTopic ? {
  ORDER_TOPIC: serviceBus.outputs.topicName
  BILLING_SUBSCRIPTION: 'billing'
  SHIPPING_SUBSCRIPTION: 'shipping'
} : {}
var outboxSettings = withOutbox ? {
  // The orders consumer publishes OrderAccepted there through its outbox (Data Sender on it only).
  ORDER_ACCEPTED_TOPIC: serviceBus.outputs.topicName
} : {}
var sessionsSettings = withSessions ? {
  ORDER_STATUS_QUEUE: serviceBus.outputs.statusQueueName
} : {}
var batchSettings = withBatch ? {
  LEDGER_QUEUE: 'ledger'
} : {}
var balancesSettings = withBalances ? {
  BALANCES_QUEUE: 'balances'
} : {}
var eventHubsSettings = withEventHubs ? {
  EventHubConnection__fullyQualifiedNamespace: eventHubs.outputs.fullyQualifiedNamespace
  EventHubConnection__credential: 'managedidentity'
  EventHubConnection__clientId: identity.outputs.clientId
  SHIPMENT_HUB: eventHubs.outputs.hubName
} : {}
// The queue triggers' one identity connection, for every Storage queue the app consumes (its
// roles: on each queue, roles.bicep).
var storageQueueSettings = withStorageQueues ? {
  StorageQueueConnection__queueServiceUri: storageQueues.outputs.queueServiceUri
  StorageQueueConnection__credential: 'managedidentity'
  StorageQueueConnection__clientId: identity.outputs.clientId
} : {}
var queueSettings = withQueue ? {
  RETURNS_QUEUE: 'returns'
} : {}
var blobImportSettings = withBlobImport ? {
  // The blob trigger's identity connection: the blobs, and the queues the extension keeps
  // (the poison queue webjobs-blobtrigger-poison) in this account.
  IMPORTS_CONTAINER: blobImports.outputs.container
  ImportsConnection__blobServiceUri: blobImports.outputs.blobServiceUri
  ImportsConnection__queueServiceUri: blobImports.outputs.queueServiceUri
  ImportsConnection__credential: 'managedidentity'
  ImportsConnection__clientId: identity.outputs.clientId
} : {}
var paymentsSettings = withPayments ? {
  PAYMENT_API_URL: paymentApiUrl
} : {}

module functionApp 'modules/functionapp.bicep' = {
  name: 'functionapp'
  params: {
    name: '${abbrs.webSitesFunctions}${environmentName}-${suffix}'
    location: location
    tags: tags
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    storageAccountName: storage.outputs.name
    deploymentContainerUrl: storage.outputs.deploymentContainerUrl
    appInsightsConnectionString: monitoring.outputs.appInsightsConnectionString
    easyAuthClientId: easyAuthClientId
    subnetId: vnetEnabled ? network.outputs.appSubnetId : ''
    pythonVersion: pythonVersion
    appSettings: union(settings, topicSettings, outboxSettings, sessionsSettings, batchSettings, balancesSettings, eventHubsSettings, paymentsSettings, storageQueueSettings, queueSettings, blobImportSettings)
  }
}

module roles 'modules/roles.bicep' = {
  name: 'roles'
  params: {
    principalId: identity.outputs.principalId
    storageAccountName: storage.outputs.name
    serviceBusName: serviceBus.outputs.name
    appInsightsName: monitoring.outputs.appInsightsName
    cosmosAccountName: (dedupStore == 'cosmos') ? cosmos.outputs.name : ''
    eventGridTopicName: eventGrid.outputs.name
    eventGridPrincipalId: eventGrid.outputs.principalId
    eventDeadLetterContainer: storage.outputs.eventDeadLetterContainer
    operatorPrincipalId: principalId
    ordersQueueName: serviceBus.outputs.queueName
    receiveQueues: concat(queues, withSessions ? [serviceBus.outputs.statusQueueName] : [])
    orderTopicName: serviceBus.outputs.topicName
    topicSubscriptions: topicSubscriptions
    outbox: withOutbox
    eventHubsName: withEventHubs ? eventHubs.outputs.name : ''
    shipmentHubName: withEventHubs ? eventHubs.outputs.hubName : ''
    recordsName: 'records'
    storageQueues: storageQueueNames
    blobTrigger: withBlobImport
  }
  dependsOn: [storageQueues]
}

// The example's: the order_events function's subscription (make remove-example deletes this block).
module eventSubscription 'modules/eventgrid-subscription.bicep' = if (deployEventSubscription) {
  name: 'eventgrid-subscription'
  params: {
    name: 'order-events'
    eventTypes: ['com.example.order.shipped']
    topicName: eventGrid.outputs.name
    functionAppName: functionApp.outputs.name
    functionName: 'order_events'
    storageAccountName: storage.outputs.name
    deadLetterContainer: storage.outputs.eventDeadLetterContainer
    eventTimeToLiveInMinutes: eventTimeToLiveInMinutes
    maxDeliveryAttempts: eventMaxDeliveryAttempts
  }
  dependsOn: [roles]
}

output AZURE_FUNCTION_APP_NAME string = functionApp.outputs.name
output AZURE_RESOURCE_GROUP string = resourceGroup().name
output SERVICEBUS_FULLY_QUALIFIED_NAMESPACE string = serviceBus.outputs.fullyQualifiedNamespace
output SERVICEBUS_QUEUE string = serviceBus.outputs.queueName
output EVENTGRID_TOPIC_ENDPOINT string = eventGrid.outputs.endpoint
output DEDUP_STORAGE_ENDPOINT string = storage.outputs.tableEndpoint
output COSMOS_ENDPOINT string = (dedupStore == 'cosmos') ? cosmos.outputs.endpoint : ''
output DEDUP_RETENTION string = 'P${dedupRetentionDays}D'
// The blob-import recipe's subscription, created by azd's postdeploy hook (empty: recipe off).
output IMPORTS_SYSTEM_TOPIC string = withBlobImport ? blobImports.outputs.systemTopicName : ''
output IMPORTS_CONTAINER string = withBlobImport ? blobImports.outputs.container : ''
output EVENT_DEAD_LETTER_CONTAINER string = storage.outputs.eventDeadLetterContainer
