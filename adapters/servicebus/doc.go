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
// LockDuration.
//
// # Ordered groups: session entities
//
// Service Bus keeps order only within a session, so a GroupKey is a
// SessionId and ordering (dedupq.ConsumerOptions.Ordered) needs an entity
// created with RequiresSession: a queue, or a topic subscription (fixed at
// creation; create=true&sessions=true in the URL creates one, and
// sessions=true with window states one). On an entity without sessions
// Subscription.OrdersGroups says so and an ordered Consumer is refused;
// on a session entity a message without a GroupKey is refused before it
// is sent, as Service Bus would refuse it. Duplicate detection works with
// sessions as without (MessageId within the window).
//
// A Subscription on a session entity (OpenSessionSubscription; the URL
// opener picks it from the entity's properties) accepts the next available
// session (AcceptNextSessionForQueue / ForSubscription) and holds up to as
// many at once as one Receive has asked deliveries for (so at most the
// Consumer's Concurrency). Each held session has one message out at a
// time: its next is received once the one before it is settled, and only
// while a Receive waits, so a session's messages are handed out in the
// session's order and never two at once. A session is locked for
// LockDuration (the lease of its deliveries, counted from what is left of
// the lock when a message arrives): Extend renews the session lock while
// a message of it runs or is held, and the Subscription renews it itself
// while nothing of the session is out; a session with nothing out and no
// new message for Options.SessionIdle (session_idle, 1s by default) is
// closed, for another process or another session to take; Close closes
// them all.
//
// A failed head is abandoned (after the nack's delay, held as below),
// which puts it back at its place in its session: it comes again, to the
// same holder, before the session's later messages. Its DeliveryCount
// grows by one each time, and so does that of any message given back on
// its behalf or left unsettled when a session is let go; at
// MaxDeliveryCount Service Bus dead-letters it, and the session goes on
// with the next. Takeover: when a holder closes, its sessions are free at
// once; when it dies without closing (or stops renewing), its sessions
// are free when their lock lapses, within LockDuration. Either way the
// next holder gets the unsettled messages first, in order, each with one
// more delivery counted.
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
