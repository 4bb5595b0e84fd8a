// The eventhubs recipe (main.bicep deploys it only then): Event Hubs Standard with local
// (SAS) auth off, the shipment tracking stream. The trigger's
// checkpoints live in the app's own storage account (AzureWebJobsStorage, blob role already
// granted). A replay from a checkpoint can bring events back up to `retentionDays` later:
// the dedup markers must outlive it (`make check-retention` reads it).
param name string
param location string
param tags object
param retentionDays int
param privateOnly bool = false

resource namespace 'Microsoft.EventHub/namespaces@2024-01-01' = {
  name: name
  location: location
  tags: tags
  sku: { name: 'Standard', tier: 'Standard', capacity: 1 }
  properties: {
    disableLocalAuth: true
    minimumTlsVersion: '1.2'
    publicNetworkAccess: privateOnly ? 'Disabled' : 'Enabled'
  }
}

resource shipments 'Microsoft.EventHub/namespaces/eventhubs@2024-01-01' = {
  parent: namespace
  name: 'shipments'
  properties: {
    partitionCount: 4
    messageRetentionInDays: retentionDays
  }
}

output name string = namespace.name
output id string = namespace.id
output fullyQualifiedNamespace string = '${namespace.name}.servicebus.windows.net'
output hubName string = shipments.name
