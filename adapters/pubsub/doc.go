// Package pubsub is dedupq's driver for Google Cloud Pub/Sub, on
// cloud.google.com/go/pubsub/v2.
//
// Import it for its side effect to open topics and subscriptions by URL:
//
//	import _ "github.com/dedupq/dedupq/adapters/pubsub"
//	p, err := dedupq.OpenPublisher(ctx, "pubsub://my-project/orders", dedupq.PublisherOptions{
//		ConsumerDedupTTL: 24 * time.Hour, // required for any retrying publisher: see below
//	})
//	c, err := dedupq.OpenConsumer(ctx, "pubsub://my-project/orders-worker", dedupq.ConsumerOptions{Dedup: guard})
//
// or build drivers from a client with NewClient, OpenTopic and
// OpenSubscription. See URLOpener for the URL's parameters.
//
// # No publish-side dedup: the window is none
//
// Pub/Sub does not deduplicate publishes: a message published twice is two
// messages with two message IDs. Its window is therefore window.KindNone
// (a documented fact, not read from the service), and dedupq's startup check
// refuses every publisher that retries — the default retry policy included
// — unless it declares PublisherOptions.ConsumerDedupTTL, that is, unless
// its consumers run consumer-side dedup (package dedup) long enough to
// absorb every resend. That refusal is the point: on Pub/Sub, "retry with
// the same ID" is only safe because the consumer remembers the ID. A
// publisher with MaxAttempts 1 is accepted as is, and then each message is
// sent at most once by dedupq (and by the client, see below).
//
// Exactly-once delivery, a subscription setting, is a different guarantee:
// after a successful acknowledgement the message is not redelivered to that
// subscription. It does nothing for messages published twice. The adapter
// reports it in SubscriptionInfo.ExactlyOnce and makes acks wait for the
// service's answer when it is on (see Consumer).
//
// # Mapping
//
// A message's ID travels in the attribute AttrID ("dedupq-id") and comes back
// as the delivery's Message.ID; attribute names starting with
// ReservedAttrPrefix are reserved, so 99 of Pub/Sub's 100 attributes are
// left to users. GroupKey is the ordering key; publishing always enables
// message ordering on the client, and a subscription delivers by key in
// order only when it was created with message ordering. Result.BackendID and
// Delivery.BackendID are Pub/Sub's message ID. A message published by
// something other than dedupq (no AttrID) is delivered with its Pub/Sub
// message ID as Message.ID, which is stable across its redeliveries and
// unique within its topic, so a dedup Guard runs each such message once.
// Consumers of different topics that receive such messages should not
// share a dedup store namespace.
//
// Limits are Pub/Sub's: at most 100 attributes per message (99 for users),
// attribute names up to 256 bytes and not starting with "goog", attribute
// values up to 1024 bytes of UTF-8 (so IDs too), ordering keys up to 1024
// bytes, and a message of at most 10 MB as the service encodes it.
//
// # Publishing: one attempt, bounded by the attempt's context
//
// The client's Publisher batches messages and publishes each bundle under a
// context of its own, detached from the caller's and bounded only by
// PublishSettings.Timeout (60 s by default), and its gRPC retry policy
// resends a bundle on Unavailable, DeadlineExceeded and other codes, with
// 100 ms to 60 s backoff. Each such resend can store the messages again, and
// can land long after the caller gave up. The adapter rules both out:
//
//   - Each SendBatch uses a fresh client Publisher whose PublishSettings.Timeout
//     is the time left until the SendBatch context's deadline (or
//     Options.PublishTimeout when it has none), with enough workers that no
//     bundle waits for one, and flushes it at once. No RPC of an attempt can
//     therefore outlive the attempt's deadline.
//   - NewClient (which the URL opener uses) turns off the client's own retries
//     of Publish, so each bundle is one RPC and every resend is one the
//     dedupq Publisher makes and counts in RetryPolicy.Span.
//
// HiddenRetrySpan is then zero. With a client of your own whose Publish calls
// still retry, a single SendBatch may store a message more than once, so
// HiddenRetrySpan reports Options.PublishTimeout and the startup check asks
// for ConsumerDedupTTL even with MaxAttempts 1.
//
// Ordered publishing pauses an ordering key after a failed publish: the
// client fails every later message of that key with ErrPublishingPaused until
// ResumePublish is called. Because each attempt has its own client
// Publisher, a pause never outlives the attempt; inside an attempt the
// adapter publishes a key's messages in request-sized chunks, one after the
// other, and once a chunk fails it sends none of the key's later messages
// (they fail with an error matching ErrEarlierFailed, which is retryable).
// The dedupq Publisher's retry then resends the failed message and all later
// ones of its key in their original order, so a key's order survives a
// failure — up to the duplicate that a maybe-sent first copy leaves, which
// consumer-side dedup removes.
//
// # Consuming: the Receive callback bridged to pull
//
// A Subscription runs the client's Subscriber.Receive in the background and
// hands each message from the callback to Subscription.Receive through a
// channel. The callback then waits until the delivery is settled, so
// nothing is acked or nacked implicitly, the client's flow control
// (Options.MaxOutstandingMessages) counts messages until they are settled,
// and on an ordered subscription the client's per-key sequencing holds:
// the next message of a key is not handed out while the previous one is in
// flight. A message still waiting in a callback when the Subscription
// closes is nacked, and so is one handed out but never settled.
//
// Delivery.Attempt is the service's DeliveryAttempt, which Pub/Sub fills in
// only on subscriptions with a dead-letter policy. Without one, the adapter
// counts the deliveries of each message ID that this Subscription has
// seen (at most 100 000 IDs; a message first delivered to another process
// starts at 1 here).
//
// Ack uses AckWithResult and waits for the result; on an exactly-once
// subscription that is the service's confirmation, and any status other than
// Success is returned as an *AckError — an ack is never assumed. Without
// exactly-once the client resolves the result at once and sends the ack
// later, in a batch, without confirmation.
//
// Pub/Sub has no per-message redelivery delay, so the Consumer honours a
// nack's delay by holding the delivery (the Subscription is a
// driver.NackHolder): the message stays unsettled in the client, whose
// lease management keeps extending its ack deadline, and the Consumer calls
// Nack when the delay has passed, or at once when its Run stops; when the
// Consumer is closed it leaves the message to Close, which has the client
// nack it once its stream has closed (a nack sent before could be handed
// straight back down the closing stream). The hold
// is capped (MaxNackHold) at the lease (Options.AckExtension, see below)
// and at what remains of Options.MaxExtension since receipt; it covers the
// wait dedup.Guard asks for when another handler holds a key, which would
// otherwise burn a delivery attempt at once. The subscription's retry
// policy, if any, applies after the hold. Nack itself nacks at once.
//
// The client manages ack deadlines itself: it extends the lease of every
// message it holds by Options.AckExtension at a time, until the message is
// settled or Options.MaxExtension has passed since it was received. Extend
// therefore sends nothing; it reports whether the client's lease
// management still covers the requested extension, and an error once it
// would outlast MaxExtension.
//
// Pub/Sub has no call that terminates a message. On a subscription with a
// dead-letter policy, Terminate nacks the message and remembers its ID: each
// redelivery of it to this Subscription is nacked again without reaching
// the handler, until the service's delivery attempts run out and it forwards
// the message to the dead-letter topic (Pub/Sub counts at least 5). The
// service counts attempts only while the dead-letter topic's permissions
// are right, approximately, and may reset the count, so the loop is
// bounded: a message this Subscription has nacked twice the policy's
// max_delivery_attempts and that still comes back is acked, dropped as
// without a dead-letter policy. A redelivery to another process reaches
// that process's handler, which will normally terminate it again. Without
// a dead-letter policy Terminate acks the message: it is dropped, as
// driver.Subscription asks.
//
// # Window and redelivery, read from the subscription
//
// Subscription.Window and Redelivery read the live subscription with
// SubscriptionAdminClient.GetSubscription. The window is KindNone, scoped
// to the subscription's topic so that publisher and consumer report the
// same window. The redelivery policy is: deliveries unlimited in count,
// bounded by the message's expiry (RedeliveryPolicy.Expiry: the
// subscription's message retention, 7 days by default, or the topic's
// retention where that is longer), because Pub/Sub honours a dead-letter
// policy's max_delivery_attempts only on a best-effort basis — it counts
// attempts only while the dead-letter topic's permissions are right,
// approximately, and may reset the count ("Handle message failures", "How
// maximum delivery attempts are calculated") — while it retries delivery
// only until the message expires. A dedup TTL must therefore cover the
// retention (plus one lease); lower the subscription's
// message_retention_duration (10 minutes at least) to need a shorter one.
// AckWait is the lease the
// client keeps on a message it holds (see Options.AckExtension); and as the
// backoff before every redelivery, the longest hold of a nack (the
// lease) plus, when the subscription has a retry policy, its maximum
// backoff — an upper bound, since Pub/Sub grows the backoff exponentially
// between the minimum and the maximum without documenting the steps. The
// hold is counted so that Span stays a worst case; the Consumer then also
// holds a nack whose handler asked for no delay for the lease.
package pubsub
