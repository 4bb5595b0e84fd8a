// What the pattern says to watch, as alert rules and a workbook: a fingerprint conflict
// (dead-lettered) raises an alert; a rising duplicate rate means a misconfigured producer, a
// lock too short or failing consumers. Queries read the telemetry the code emits (names and
// dimensions checked by tests/integration/test_telemetry.py); metric alerts watch the brokers.
param location string
param tags object
param appInsightsName string
param serviceBusName string
param eventGridTopicName string
@description('E-mail address for the alerts (empty: alerts fire in the portal only).')
param alertEmail string = ''
@description('eventhubs recipe: events parked past the checkpoint.')
param eventHubs bool = false
@description('outbox recipe: the outbox sweep\'s backlogs.')
param outbox bool = false
@description('payments recipe (two-phase steps): claims stuck in progress.')
param steps bool = false
@description('queue and blob-import recipes: what the host moved to a Storage poison queue.')
param storagePoison bool = false

resource appInsights 'Microsoft.Insights/components@2020-02-02' existing = {
  name: appInsightsName
}

resource serviceBus 'Microsoft.ServiceBus/namespaces@2024-01-01' existing = {
  name: serviceBusName
}

resource topic 'Microsoft.EventGrid/topics@2022-06-15' existing = {
  name: eventGridTopicName
}

resource actionGroup 'Microsoft.Insights/actionGroups@2023-01-01' = if (!empty(alertEmail)) {
  name: 'ag-dedup-${uniqueString(resourceGroup().id)}'
  location: 'global'
  tags: tags
  properties: {
    groupShortName: 'dedup'
    enabled: true
    emailReceivers: [{ name: 'operators', emailAddress: alertEmail, useCommonAlertSchema: true }]
  }
}

var actions = empty(alertEmail) ? [] : [actionGroup.id]

// name, severity, window, threshold, query (a number per window: the alert fires above the threshold):
// those of every app, then each recipe's (its telemetry exists only with it).
var coreAlerts = [
  {
    name: 'dedup-conflicts'
    description: 'A key was reused with another payload: the message was dead-lettered (fingerprint_mismatch).'
    severity: 1
    window: 'PT15M'
    threshold: 0
    query: 'customMetrics | where name == "dedup.outcomes" and tostring(customDimensions.outcome) == "conflict" | summarize value = sum(valueSum)'
  }
  {
    // Waits absorb blips: transient outcomes are ~0 in normal operation. 5% of at least 20
    // outcomes for 15 minutes means the store or a downstream is failing beyond the waits.
    name: 'dedup-transient-rate'
    description: 'More than 5% of outcomes transient: the store or a downstream keeps failing.'
    severity: 2
    window: 'PT15M'
    threshold: 5
    query: 'customMetrics | where name == "dedup.outcomes" | summarize total = sum(valueSum), transient = sumif(valueSum, tostring(customDimensions.outcome) == "transient") | where total >= 20 | project value = 100.0 * transient / total'
  }
  {
    // With send-side duplicate detection, redeliveries come from lost locks and crashes:
    // well under 1%. 10% for an hour is a producer retrying with new ids, a lock too short or
    // consumers that fail after committing.
    name: 'dedup-duplicate-rate'
    description: 'More than 10% of deliveries are duplicates: producer, lock duration or consumer failures.'
    severity: 3
    window: 'PT1H'
    threshold: 10
    query: 'customMetrics | where name in ("dedup.outcomes", "dedup.duplicates") | summarize total = sumif(valueSum, name == "dedup.outcomes"), duplicates = sumif(valueSum, name == "dedup.duplicates") | where total >= 100 | project value = 100.0 * duplicates / total'
  }
  {
    // The audit (audit_consumers, hourly): a sequence number neither the consumer nor the broker holds.
    name: 'dedup-unaccounted'
    description: 'The audit found messages lost between Service Bus and the consumer: their dead-letter records (reason unaccounted) name each sequence number.'
    severity: 1
    window: 'PT1H'
    threshold: 0
    query: 'customMetrics | where name == "dedup.audit" and tostring(customDimensions.found) == "unaccounted" | summarize value = sum(valueSum)'
  }
  {
    // A message first enqueued longer ago than DEDUP_RETENTION (less an hour): its marker may be
    // gone, so it was refused, never applied; a producer or a resubmission sent something stale.
    name: 'dedup-expired'
    description: 'A message older than its marker is sure to be kept was refused (reason expired): its dead-letter record holds it.'
    severity: 2
    window: 'PT1H'
    threshold: 0
    query: 'customMetrics | where name == "dedup.outcomes" and tostring(customDimensions.outcome) == "invalid" and tostring(customDimensions.reason) == "expired" | summarize value = sum(valueSum)'
  }
  {
    name: 'dedup-purge-backlog'
    description: 'Every purge run of the last hour (one per 5 min) stopped with work left: expired markers pile up faster than they are deleted.'
    severity: 3
    window: 'PT1H'
    threshold: 11
    query: 'customMetrics | where name == "dedup.purge.runs" and tostring(customDimensions.budget_spent) == "true" | summarize value = sum(valueSum)'
  }
]
var eventHubsAlerts = [
  {
    name: 'dedup-parked'
    description: 'Event Hubs events still failing when the checkpoint moved on: replay them (python -m shared.idempotency.replay).'
    severity: 1
    window: 'PT15M'
    threshold: 0
    query: 'customMetrics | where name == "dedup.outcomes" and tostring(customDimensions.outcome) == "parked" | summarize value = sum(valueSum)'
  }
]
var stepsAlerts = [
  {
    name: 'dedup-escalations'
    description: 'Two-phase claims stuck in progress past DEDUP_STALE_AFTER: an external call may be half done.'
    severity: 2
    window: 'PT1H'
    threshold: 0
    query: 'customMetrics | where name == "dedup.escalations" | summarize value = sum(valueSum)'
  }
]
var outboxAlerts = [
  {
    name: 'dedup-outbox-backlog'
    description: 'The outbox sweep could not send parked messages (their destination keeps failing).'
    severity: 2
    window: 'PT1H'
    threshold: 0
    query: 'customMetrics | where name == "dedup.outbox.swept" and tostring(customDimensions.result) == "failed" | summarize value = sum(valueSum)'
  }
  {
    name: 'dedup-outbox-sweep-behind'
    description: 'Every outbox sweep of the last hour stopped at its budget or deadline with due keys left: messages are parked faster than they are sent.'
    severity: 3
    window: 'PT1H'
    threshold: 11
    query: 'customMetrics | where name == "dedup.outbox.sweep.runs" and tostring(customDimensions.budget_spent) == "true" | summarize value = sum(valueSum)'
  }
]
var storagePoisonAlerts = [
  {
    // The host's own warning as it moves a message (queue recipe) or a blob's run (blob-import
    // recipe) to <queue>-poison or webjobs-blobtrigger-poison: no metric counts one queue's messages.
    name: 'storage-poison-queue'
    description: 'The host moved a message to a Storage poison queue: <queue>-poison (a dead-letter record says why, but when the instance died on its last dequeue), or webjobs-blobtrigger-poison (a blob whose import kept failing: upload it again once fixed).'
    severity: 1
    window: 'PT15M'
    threshold: 0
    query: 'traces | where message has "Moving message to queue" | summarize value = count()'
  }
]
var logAlerts = concat(coreAlerts, eventHubs ? eventHubsAlerts : [], steps ? stepsAlerts : [], outbox ? outboxAlerts : [], storagePoison ? storagePoisonAlerts : [])

resource rules 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = [for rule in logAlerts: {
  name: rule.name
  location: location
  tags: tags
  properties: {
    description: rule.description
    severity: rule.severity
    enabled: true
    scopes: [appInsights.id]
    evaluationFrequency: rule.window == 'P1D' ? 'PT1H' : 'PT5M'
    windowSize: rule.window
    criteria: {
      allOf: [
        {
          query: rule.query
          timeAggregation: 'Maximum'
          metricMeasureColumn: 'value'
          operator: 'GreaterThan'
          threshold: rule.threshold
          failingPeriods: { numberOfEvaluationPeriods: 1, minFailingPeriodsToAlert: 1 }
        }
      ]
    }
    actions: { actionGroups: actions }
  }
}]

// The canary's heartbeat (shared/idempotency/canary.py): send_canaries logs canary.sent for each
// Service Bus entity every interval, each consumer logs canary.seen for each canary it commits.
// One row per (entity, consumer) that stalled: no canary seen for two intervals while they were
// sent, none ever seen since the first was sent two intervals ago, or none sent for two
// intervals (the app or its timer stopped). A day of logs: an entity or consumer removed on
// purpose raises it until its last heartbeat is a day old.
var canaryHeartbeatQuery = '''
let interval = 5m;
let events = traces
| extend event = tostring(customDimensions.dedup_event), entity = tostring(customDimensions.dedup_entity), consumer = tostring(customDimensions.dedup_consumer)
| where event in ("canary.sent", "canary.seen");
let sent = events | where event == "canary.sent" | summarize firstSent = min(timestamp), lastSent = max(timestamp) by entity;
let seen = events | where event == "canary.seen" | summarize lastSeen = max(timestamp) by entity, consumer;
sent
| join kind=leftouter seen on entity
| where lastSent < ago(2 * interval) or (firstSent < ago(2 * interval) and (isnull(lastSeen) or lastSeen < ago(2 * interval)))
| summarize value = count()
'''

resource canaryHeartbeat 'Microsoft.Insights/scheduledQueryRules@2023-03-15-preview' = {
  name: 'dedup-canary-heartbeat'
  location: location
  tags: tags
  properties: {
    description: 'A Service Bus entity\'s consumer saw no canary for two intervals (10 minutes): it stopped, or its host settles messages without invoking it. Or the canaries stopped being sent (the app is down).'
    severity: 1
    enabled: true
    scopes: [appInsights.id]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT5M'
    overrideQueryTimeRange: 'P1D'
    criteria: {
      allOf: [
        {
          query: canaryHeartbeatQuery
          timeAggregation: 'Maximum'
          metricMeasureColumn: 'value'
          operator: 'GreaterThan'
          threshold: 0
          failingPeriods: { numberOfEvaluationPeriods: 1, minFailingPeriodsToAlert: 1 }
        }
      ]
    }
    actions: { actionGroups: actions }
  }
}

// Messages the brokers dead-lettered: the consumer records why before the last delivery.
resource serviceBusDeadLetters 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: 'servicebus-dead-lettered'
  location: 'global'
  tags: tags
  properties: {
    description: 'Messages in a queue or subscription dead-letter queue.'
    severity: 1
    enabled: true
    scopes: [serviceBus.id]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          name: 'deadlettered'
          criterionType: 'StaticThresholdCriterion'
          metricNamespace: 'Microsoft.ServiceBus/namespaces'
          metricName: 'DeadletteredMessages'
          dimensions: [{ name: 'EntityName', operator: 'Include', values: ['*'] }]
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Maximum'
        }
      ]
    }
    actions: [for group in actions: { actionGroupId: group }]
  }
}

resource eventGridDeadLetters 'Microsoft.Insights/metricAlerts@2018-03-01' = {
  name: 'eventgrid-dead-lettered'
  location: 'global'
  tags: tags
  properties: {
    description: 'Events Event Grid gave up on and dead-lettered to blob.'
    severity: 1
    enabled: true
    scopes: [topic.id]
    evaluationFrequency: 'PT5M'
    windowSize: 'PT15M'
    criteria: {
      'odata.type': 'Microsoft.Azure.Monitor.SingleResourceMultipleMetricCriteria'
      allOf: [
        {
          name: 'deadlettered'
          criterionType: 'StaticThresholdCriterion'
          metricNamespace: 'Microsoft.EventGrid/topics'
          metricName: 'DeadLetteredCount'
          operator: 'GreaterThan'
          threshold: 0
          timeAggregation: 'Total'
        }
      ]
    }
    actions: [for group in actions: { actionGroupId: group }]
  }
}

// The dashboard: outcomes, duplicate rate and claim durations over time.
var workbookContent = loadJsonContent('workbook.json')

resource workbook 'Microsoft.Insights/workbooks@2023-06-01' = {
  name: guid(resourceGroup().id, 'dedup-workbook')
  location: location
  tags: tags
  kind: 'shared'
  properties: {
    displayName: 'Idempotent consumers'
    category: 'workbook'
    sourceId: appInsights.id
    serializedData: string(workbookContent)
  }
}
