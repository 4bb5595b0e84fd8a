// vnetEnabled: the app's outbound traffic through a VNet (Flex Consumption VNet integration)
// and private endpoints for every data plane it reaches — storage (blob, queue, table), Service
// Bus (Premium: only Premium namespaces take private endpoints), Event Hubs (eventhubs recipe)
// and, with dedupStore=cosmos, Cosmos DB — each resolved through its private DNS zone. Those
// resources then refuse public network access (their modules read vnetEnabled).
param name string
param location string
param tags object
param storageAccountId string
param serviceBusId string
@description('Empty without the eventhubs recipe.')
param eventHubsId string = ''
param cosmosAccountId string = ''

var endpoints = concat([
  { name: 'blob', target: storageAccountId, group: 'blob', zone: 'privatelink.blob.${environment().suffixes.storage}' }
  { name: 'queue', target: storageAccountId, group: 'queue', zone: 'privatelink.queue.${environment().suffixes.storage}' }
  { name: 'table', target: storageAccountId, group: 'table', zone: 'privatelink.table.${environment().suffixes.storage}' }
  { name: 'servicebus', target: serviceBusId, group: 'namespace', zone: 'privatelink.servicebus.windows.net' }
], empty(eventHubsId) ? [] : [
  { name: 'eventhubs', target: eventHubsId, group: 'namespace', zone: 'privatelink.servicebus.windows.net' }
], empty(cosmosAccountId) ? [] : [
  { name: 'cosmos', target: cosmosAccountId, group: 'Sql', zone: 'privatelink.documents.azure.com' }
])
var zones = concat([
  'privatelink.blob.${environment().suffixes.storage}'
  'privatelink.queue.${environment().suffixes.storage}'
  'privatelink.table.${environment().suffixes.storage}'
  'privatelink.servicebus.windows.net' // Service Bus and Event Hubs share it
], empty(cosmosAccountId) ? [] : ['privatelink.documents.azure.com'])

resource vnet 'Microsoft.Network/virtualNetworks@2024-01-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    addressSpace: { addressPrefixes: ['10.0.0.0/16'] }
    subnets: [
      {
        name: 'app'
        properties: {
          addressPrefix: '10.0.1.0/24'
          delegations: [{ name: 'flex', properties: { serviceName: 'Microsoft.App/environments' } }]
        }
      }
      {
        name: 'endpoints'
        properties: { addressPrefix: '10.0.2.0/24', privateEndpointNetworkPolicies: 'Disabled' }
      }
    ]
  }
}

resource dnsZones 'Microsoft.Network/privateDnsZones@2020-06-01' = [for zone in zones: {
  name: zone
  location: 'global'
  tags: tags
}]

resource dnsLinks 'Microsoft.Network/privateDnsZones/virtualNetworkLinks@2020-06-01' = [for (zone, i) in zones: {
  parent: dnsZones[i]
  name: 'link-${name}'
  location: 'global'
  properties: { virtualNetwork: { id: vnet.id }, registrationEnabled: false }
}]

resource privateEndpoints 'Microsoft.Network/privateEndpoints@2024-01-01' = [for endpoint in endpoints: {
  name: 'pe-${endpoint.name}-${name}'
  location: location
  tags: tags
  properties: {
    subnet: { id: vnet.properties.subnets[1].id }
    privateLinkServiceConnections: [
      { name: endpoint.name, properties: { privateLinkServiceId: endpoint.target, groupIds: [endpoint.group] } }
    ]
  }
}]

resource zoneGroups 'Microsoft.Network/privateEndpoints/privateDnsZoneGroups@2024-01-01' = [for (endpoint, i) in endpoints: {
  parent: privateEndpoints[i]
  name: 'default'
  properties: {
    privateDnsZoneConfigs: [
      { name: endpoint.name, properties: { privateDnsZoneId: resourceId('Microsoft.Network/privateDnsZones', endpoint.zone) } }
    ]
  }
  dependsOn: [dnsZones]
}]

output appSubnetId string = vnet.properties.subnets[0].id
