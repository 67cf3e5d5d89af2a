// Package jetstream is dedupq's NATS JetStream backend: a driver.Topic that
// publishes with the Nats-Msg-Id header and a driver.Subscription on a
// durable pull consumer.
//
// Importing the package registers the "jetstream" URL scheme with
// dedupq.Register, so that
//
//	dedupq.OpenPublisher(ctx, "jetstream://127.0.0.1:4222/ORDERS?subject=orders", opts)
//	dedupq.OpenConsumer(ctx, "jetstream://127.0.0.1:4222/ORDERS?subject=orders&durable=billing", opts)
//
// work without other code. OpenTopic and OpenSubscription do the same on a
// connection the program dials itself. Package embedded runs a server in
// process for programs that should need no services.
//
// # URL
//
//	jetstream://[user:password@]host[:port]/STREAM?subject=SUBJECT[&durable=NAME][&…]
//
// The host defaults to 127.0.0.1 and the port to 4222; user info is passed
// to the NATS client as in a nats:// URL. Parameters, all but subject
// optional (see Config for what each does):
//
//	subject=orders        subject to publish to; required
//	durable=billing       durable pull consumer; required to consume
//	create=true           create the stream when it does not exist
//	storage=memory        storage of a created stream: file (default) or memory
//	window=2m             the stream's dedup window (Duplicates): used when
//	                      creating the stream, checked against it otherwise
//	ack_wait=30s          the consumer's AckWait: used when creating the
//	                      durable, checked against it otherwise
//	max_deliveries=5      the consumer's MaxDeliver (-1 unlimited): same
//	backoff=1s,5s,30s     the consumer's BackOff: same
//	max_batch=1024        messages per concurrent publish batch
//	ordered=true          a durable that keeps each GroupKey's order: created
//	                      with a pinned priority group, checked otherwise
//	                      (see Ordered groups)
//	pin_ttl=40s           an ordered durable's PinnedTTL: used when creating
//	                      it, checked against it otherwise
//
// A missing, repeated, malformed or unknown parameter is a
// *dedupq.ParamError naming it.
//
// The host "embedded" (EmbeddedHost), without a port, names a server inside
// the process, which package embedded runs: importing it, even only as
//
//	import _ "github.com/dedupq/dedupq/adapters/jetstream/embedded"
//
// makes jetstream://embedded/ORDERS?subject=orders&create=true work in any
// program, with no services (see that package for the server's lifetime).
// Without it such a URL fails with a *dedupq.ParamError saying so, and the
// client never looks "embedded" up as a host name.
//
// Nothing is created while opening: the stream (with create=true) and a
// missing durable are created only once the Publisher's or Consumer's
// startup check passed on the settings they will have (driver.Provisioner),
// so a refused open leaves the server as it was.
//
// # Mapping
//
// Message.ID travels in the Nats-Msg-Id header, which the stream
// deduplicates on; a send the stream dropped as a duplicate reports
// SendResult.Duplicate. BackendID is the stream sequence.
//
// A message stored without a Nats-Msg-Id (published by "nats pub" or
// another service, or sourced from another stream) is delivered with
// Message.ID "stream <stream> seq <stream sequence> time <stored time,
// Unix ns>": its identity in the stream, the same on every redelivery, so
// a dedup Guard runs each such message once and never takes two of them
// for one. Two publishes of the same payload without an ID are two
// messages. The spaces keep it apart from every ID a dedupq Publisher can
// send. The key is the stream's, so a consumer moved to another stream
// holding the same messages (a mirror, a re-import) sees new keys.
//
// Attributes travel
// as NATS headers, one header per attribute. Names starting with "Nats-"
// (any case) are refused because the server and client give them meaning
// (Nats-Msg-Id, Nats-Expected-Stream, Nats-Rollup, Nats-TTL, …), and so are
// "Status" and "Description", which the client reads as the status of a
// control message when the body is empty. Header values cannot start or end
// with spaces or tabs or hold CR or LF (the client trims and rewrites
// them), so a message with such a value fails to send, never arriving
// changed.
//
// GroupKey becomes a subject suffix: a message with GroupKey "eu" is
// published to "<subject>.eu". The stream must therefore take both
// "<subject>" and "<subject>.<any token>" (say with "<subject>.>");
// OpenTopic checks that, and create=true makes a stream with the subjects
// "<subject>" and "<subject>.>". A Subscription consumes the
// whole stream and returns the suffix as GroupKey. JetStream keeps one
// order per stream, so messages of one group arrive in publish order; an
// ordered Consumer, which runs them one at a time, needs an ordered
// durable (see Ordered groups).
//
// # Window
//
// Topic.Window and Subscription.Window read the stream's Duplicates from
// the live stream on every call, so Publisher.Recheck notices a window that
// was changed after startup. A mirror has no window of its own (its
// messages were deduplicated by the stream it copies), so a Subscription on
// a mirror reports that stream's. Only when no window can be read that way
// is the server's documented default of two minutes assumed, marked
// window.SourceDocumented.
//
// The window protects against resends only while the stream remembers the
// IDs. A server rebuilds that memory on restart from the messages still
// stored, so on a WorkQueue or Interest stream, or one whose limits evict
// messages, IDs of messages already removed are forgotten by a restart:
// declare consumer-side dedup (PublisherOptions.ConsumerDedupTTL) when
// that matters.
//
// # Redelivery
//
// Subscription.Redelivery reads the durable's AckWait, MaxDeliver and
// BackOff from the live consumer. BackOff replaces AckWait as the ack
// timeout of each delivery (the n-th delivery is held BackOff[n-1], the
// last entry repeating), but does not apply to a negative acknowledgement,
// which redelivers at once. The policy reported is therefore MaxDeliver
// deliveries each held for the longest of AckWait and every BackOff entry,
// with no backoff between them: each delivery ends either by its own
// timeout, which is at most that long, or by a Nack, which is earlier and
// redelivers at once. The sum is an upper bound of the real schedule, not
// its exact length: it counts the longest timeout for every delivery. A
// handler that keeps its delivery alive with InProgress, or a Nack with an
// explicit delay (dedupq.RetryAfter), adds its own time on top, as on every
// backend; on a consumer with BackOff the server also adds the delivery's
// BackOff entry less AckWait to such a delay.
//
// # Sending
//
// SendBatch publishes a whole batch asynchronously (PublishMsgAsync) and
// then waits for every PubAck, so a batch costs about one round trip. The
// client's own retry on "no responders" is switched off, and the
// connections this package dials keep no reconnect buffer: a message
// written while the client reconnects would otherwise go out whenever the
// connection returns, a resend that no retry policy can bound. OpenTopic
// refuses a connection that buffers (see nats.ReconnectBufSize). A send
// that got no PubAck (timeout, lost connection, cancelled context) is
// reported retryable; a PubAck that carries an error means the stream
// refused the message and is not. The client keeps nothing of such a
// send once SendBatch returned: each call publishes on a JetStream
// context of its own, and one whose publishes went unanswered is cleaned
// up (CleanupPublisher) and not used again. The Topic also starts batches
// (driver.BatchStarter: StartBatch publishes, its wait collects the
// PubAcks): dedupq.Publisher then publishes the next chunks of a large
// batch while the server still answers the earlier ones, which reach it
// first since every publish goes out on the one connection in call order.
//
// # Consuming
//
// Ack is a double ack: it waits for the server's confirmation. Nack,
// Terminate and Extend send Nak, Term and InProgress and then flush the
// connection, so an error means the server may not have them. Terminate
// sends its reason only to servers from 2.10.4 on; older servers ignore a
// Term that carries one. Receive first takes what is waiting (FetchNoWait)
// and otherwise waits for one message with a bounded pull. When ctx ends,
// the client drops that pull and the server, which checks a pull's
// interest before delivering on it, discards it: a message published
// afterwards goes to the next Receive as attempt 1. Only a message the
// server had already sent to the pull when it was dropped is lost in
// flight; it counts as one delivery and returns after AckWait.
//
// A pull waits at most 5s, or the durable's MaxRequestExpires when that is
// shorter, and asks for at most its MaxRequestBatch, both read from the
// server at open. Opening refuses, with a *DurableError, a durable with a
// MaxRequestExpires under 1s and one with a PriorityPolicy (priority
// groups, server 2.11+) other than an ordered durable's, pinned_client with
// one group: the pulls would have to name a group and a rank this package
// cannot choose. A pull refused because MaxWaiting pulls wait already is
// transient: the Consumer retries with its backoff. A pull refused for a
// limit lowered after the open, or for a PriorityPolicy added since, makes
// Receive read the durable again: the next pull fits the new limit; a
// durable no longer usable fails with the *DurableError.
//
// # Ordered groups
//
// A Consumer with ConsumerOptions.Ordered runs the messages of a GroupKey
// one at a time, in publish order, and different groups at once up to its
// Concurrency. On JetStream it needs an ordered durable: ordered=true
// (Config.Ordered) creates the durable with PriorityPolicy pinned_client
// and one priority group, PriorityGroup, and checks an existing one for
// them (an update can add them to a durable: the refusal says which).
// Priority groups need nats-server 2.11 or later; an older one would take
// them for unknown fields and create a durable without them, so there
// ordered=true is refused at open, naming the version, and an ordered
// Consumer on another durable is refused too. A Subscription on an
// ordered durable pulls as its group (OrdersGroups, Ordering).
//
// The server hands an ordered durable's messages to one consumer at a
// time, the pinned one, and pins another only once that one has sent no
// pull for PinnedTTL. So one process consumes an ordered durable at a
// time and the others stand by: more processes add availability, not
// throughput (for more, split the groups over several subjects and
// durables). Within the process the portable layer keeps each group's
// order.
//
// A takeover must not hand a new owner message n+1 of a group before the
// old owner's unsettled n comes back. JetStream redelivers what is due
// before new messages, so it suffices that all the old owner may still
// hold is due for redelivery before the pin moves: PinnedTTL is at least
// the longest pull (the durable's MaxRequestExpires, which ordered=true
// sets to half the ack wait, from 1s to 5s) plus the ack wait plus a
// second of slack (MinPinnedTTL: 36s with the default 30s ack wait; 3s
// with ack_wait=1s). pin_ttl sets a longer one; an existing durable with a
// shorter one is refused, naming the fix. A consumer whose handlers are
// all busy does not receive, so while it holds deliveries (or nacked ones
// are not yet due) the Subscription renews its pin every half pull wait
// with a pull that cannot take a message (one byte at most). A standby
// does not keep pulls waiting, since the server moves a redelivery that a
// waiting pull may not take to the end of its redelivery queue, which
// would put the owner's given-back messages out of order; it reads the
// durable every quarter PinnedTTL (at most a second) and pulls once no one
// is pinned. A group thus waits up to PinnedTTL and that poll after its
// owner stopped (Ordering.Takeover; dedupq check prints it), for the
// window's model to count.
//
// The old owner's deliveries come back in the order of their ack
// deadlines, not the stream's (a running one extended, those waiting
// behind it not). The pull that pins a Subscription (at its start, at a
// takeover, and after a server restart, which forgets pins) therefore
// collects every redelivery then due and hands them out in stream order;
// those beyond what the Consumer asked for are nacked again, in that
// order, which costs each one delivery: count it against max_deliveries.
//
// A nack waits at most PinnedTTL less the pull wait less a second (the
// ack wait, with the PinnedTTL ordered=true sets; Ordering.MaxNackDelay):
// a message nacked for longer could still wait when another consumer is
// pinned, which would be handed later messages of its group first. A
// longer pin_ttl allows longer delays. An ordered durable has no BackOff,
// with which a redelivery's hold, and a nack's delay, would depend on its
// delivery count.
//
// Not covered: when the owner's handlers are all busy for longer than half
// a pull wait while several given-back messages of a group wait for
// redelivery, the pull that renews its pin can make the server move one of
// them to the end of its queue as well (the pull may take none), and
// those two can come back out of order; and a message lost in flight when
// Receive is cancelled (see Consuming) comes back after its ack wait,
// behind later messages of its group if the same Subscription, still
// pinned, receives again meanwhile.
package jetstream
