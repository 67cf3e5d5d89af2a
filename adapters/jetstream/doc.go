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
// order per stream, so messages of one group arrive in publish order;
// handlers running concurrently may still finish out of order.
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
// groups, server 2.11+), whose pulls would have to name a group. A pull
// refused because MaxWaiting pulls wait already is transient: the Consumer
// retries with its backoff. A pull refused for a limit lowered after the
// open, or for a PriorityPolicy added since, makes Receive read the durable
// again: the next pull fits the new limit; a durable no longer usable
// fails with the *DurableError.
package jetstream
