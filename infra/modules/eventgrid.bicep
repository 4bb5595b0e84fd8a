// Event Grid topic that accepts CloudEvents 1.0, Entra ID publishing only. Its system
// identity writes undeliverable events to the dead-letter blob container.
param name string
param location string
param tags object

resource topic 'Microsoft.EventGrid/topics@2022-06-15' = {
  // checkov:skip=CKV_AZURE_193: public endpoint by default, identity-only auth, keys off; private endpoints: docs/operations.md, Network
  name: name
  location: location
  tags: tags
  identity: { type: 'SystemAssigned' }
  properties: {
    inputSchema: 'CloudEventSchemaV1_0'
    disableLocalAuth: true
    publicNetworkAccess: 'Enabled'
  }
}

output name string = topic.name
output endpoint string = topic.properties.endpoint
output principalId string = topic.identity.principalId
