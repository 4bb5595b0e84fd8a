// Cosmos DB for NoSQL, serverless, Entra ID only. The records container is partitioned by
// /partitionKey, which the store sets to the message's partition (the order id for the
// orders consumer), so a message's marker and documents share one logical partition (one
// transactional batch); its defaultTtl is the dedup retention (markers carry their own
// ttl, business documents ttl -1).
param name string
param location string
param tags object
param defaultTtlSeconds int
param privateOnly bool = false

resource account 'Microsoft.DocumentDB/databaseAccounts@2024-11-15' = {
  // checkov:skip=CKV_AZURE_101: public endpoint by default, identity-only auth, keys off; vnetEnabled turns it off
  // checkov:skip=CKV_AZURE_99: public endpoint by default, identity-only auth, keys off; vnetEnabled turns it off
  name: name
  location: location
  tags: tags
  kind: 'GlobalDocumentDB'
  properties: {
    databaseAccountOfferType: 'Standard'
    disableLocalAuth: true
    publicNetworkAccess: privateOnly ? 'Disabled' : 'Enabled'
    disableKeyBasedMetadataWriteAccess: true // containers change through ARM (this template), never the data plane
    minimalTlsVersion: 'Tls12'
    backupPolicy: { type: 'Continuous', continuousModeProperties: { tier: 'Continuous7Days' } }
    capabilities: [{ name: 'EnableServerless' }]
    consistencyPolicy: { defaultConsistencyLevel: 'Session' }
    locations: [{ locationName: location, failoverPriority: 0 }]
  }
}

resource database 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases@2024-11-15' = {
  parent: account
  name: 'dedup'
  properties: { resource: { id: 'dedup' } }
}

resource records 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-11-15' = {
  parent: database
  name: 'records'
  properties: {
    resource: {
      id: 'records'
      partitionKey: { paths: ['/partitionKey'], kind: 'Hash', version: 2 } // v2: long keys hashed whole
      defaultTtl: defaultTtlSeconds
    }
  }
}

resource deadLetters 'Microsoft.DocumentDB/databaseAccounts/sqlDatabases/containers@2024-11-15' = {
  parent: database
  name: 'deadletters'
  properties: {
    resource: {
      id: 'deadletters'
      partitionKey: { paths: ['/scope'], kind: 'Hash', version: 2 }
      defaultTtl: -1 // TTL on, no default: each record carries DEDUP_DEAD_LETTER_RETENTION as its ttl
    }
  }
}

output name string = account.name
output id string = account.id
output endpoint string = account.properties.documentEndpoint
