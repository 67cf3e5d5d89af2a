// Package servicebus is the dedupq adapter for Azure Service Bus, on the
// azservicebus SDK.
//
// Publishing maps a message's ID to MessageId, which Service Bus's
// duplicate detection compares; GroupKey to SessionId (and PartitionKey,
// which must equal it); attributes to application properties. IDs and
// group keys are at most 128 characters, the size limit is the entity's
// (256 KiB on Standard, up to 100 MB on Premium), and a message over the
// property quotas (32 KB per attribute, 64 KB of header in all) is refused
// before anything is sent (CheckProperties). A SendBatch call sends as few
// transfers as the entity allows: MessageBatches up to the link's batch
// limit (1 MB on Premium), a larger message alone; on a partitioned entity
// one GroupKey per batch, and one message per send where duplicate
// detection is on as well, because Service Bus refuses any batch of
// distinct MessageIds there. A transfer is stored whole or not at all, so
// its failure is reported on every message in it.
//
// Service Bus accepts a duplicate send silently: SendResult.Duplicate is
// true only for an ID this Topic itself stored earlier within the window
// (under the same GroupKey on a partitioned entity, where duplicate
// detection compares MessageId with the partition key), and BackendID is
// the MessageId (a send returns no sequence number).
//
// A message received without a MessageId (sent by another publisher) is
// delivered with Message.ID "<entity> seq <sequence number> time <enqueued
// time, Unix ns>", e.g. "queue orders seq 42 time 1700000000000000000":
// its identity in the entity, the same on every redelivery, so a dedup
// Guard runs each such message once and never takes two of them for one.
// Two sends of the same payload without a MessageId are two messages.
//
// The window is read from the live entity through Options.Admin on every
// Window call: RequiresDuplicateDetection off gives window.KindNone,
// otherwise DuplicateDetectionHistoryTimeWindow as window.KindConfigured,
// window.SourceDiscovered. Programs without Manage rights state the
// properties (Options.Stated), and the window says so.
//
// Consuming uses a peek-lock Receiver: Attempt is DeliveryCount, Ack is
// Complete, Nack is Abandon, Terminate is DeadLetter with reason
// DeadLetterReason, Extend is RenewMessageLock, and the lease is
// LockDuration. Session entities are refused by OpenSubscription for now.
//
// Service Bus redelivers an abandoned message at once and has no
// per-message redelivery delay, so the Consumer honours a nack's delay by
// holding the delivery (the Subscription is a driver.NackHolder): the
// message stays locked (renewed with RenewMessageLock when the hold
// outlasts the lock) and is abandoned when the delay has passed, or at
// once when the Consumer's Run stops; when the Consumer is closed it is
// left to its lock's expiry. The hold is capped at LockDuration
// (MaxNackHold), which covers the wait dedup.Guard asks for when another
// handler holds a key; without the hold each such deferral would burn one
// of MaxDeliveryCount deliveries at once. The redelivery policy reports LockDuration as the backoff before
// every redelivery, so that Span stays a worst case; the Consumer then
// also holds a nack whose handler asked for no delay for LockDuration.
//
// Import the package to register the servicebus:// scheme (see URLOpener).
package servicebus
