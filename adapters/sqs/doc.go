// Package sqs is dedupq's driver for Amazon SQS FIFO queues.
//
// Import it for its side effect to open queues by URL:
//
//	import _ "github.com/dedupq/dedupq/adapters/sqs"
//	p, err := dedupq.OpenPublisher(ctx, "sqs://orders.fifo?region=eu-west-1", dedupq.PublisherOptions{})
//
// or build a driver from an SQS client with OpenTopic and OpenSubscription.
// Give such a client an HTTP client wrapped in KeepRequestBody, as the URL
// opener does for its own: it keeps the SDK's early close of a request body
// from failing a request the server already served.
//
// # Mapping
//
// A message's ID is sent as MessageDeduplicationId and its GroupKey as
// MessageGroupId. SQS requires a group on FIFO queues: a message without a
// GroupKey is refused before sending unless Options.DefaultGroup is set, in
// which case it is sent in that group and a consumer with the same
// DefaultGroup sees an empty GroupKey again. IDs and group keys must be at
// most 128 characters of ASCII letters, digits and punctuation; with
// Options.HashLongIDs an ID that does not fit (or that starts with
// HashPrefix) is sent as HashID(ID) — "sha256:" and 64 hex digits — and the
// original travels in the AttrID attribute, from which the consumer restores
// it. IDs are never truncated.
//
// A message sent by another publisher (no AttrID) is delivered with its
// MessageDeduplicationId as Message.ID, which SQS keeps with the message:
// the publisher's own, or the SHA-256 of the body that content-based
// deduplication computed. A FIFO message always has one, the same on every
// redelivery, so a delivery never reaches a dedup Guard without a key. Two
// sends of the same body by content-based deduplication are one message,
// as SQS itself treats them within its window.
//
// Bodies and attribute values that are not text SQS accepts (binary data,
// NUL, invalid UTF-8, empty values) are encoded so that they arrive
// unchanged; see AttrBody. Attribute names starting with ReservedAttrPrefix
// are reserved, and one of SQS's 10 attribute slots is kept for AttrBody
// (two with HashLongIDs, for AttrID too), so Limits allow 9 (or 8) user
// attributes. Sizes are checked as SQS counts them (names, data types and
// encoded values included) before sending.
//
// SQS answers a resend it dropped as a duplicate with the kept message's
// MessageId and nothing more, so a Topic reports SendResult.Duplicate when
// it was given that MessageId before within the window; a duplicate of
// what another process sent reads as a plain success.
//
// # Window
//
// SQS FIFO remembers a MessageDeduplicationId for 5 minutes, a length that
// nothing changes (window.KindFixed). The adapter still reads the queue's
// attributes on open and on every Window call: it refuses a queue that is
// not FIFO, reports DeduplicationScope (duplicates are caught only within a
// message group when it is "messageGroup"), and validates sizes against the
// queue's real MaximumMessageSize.
//
// # SDK retries
//
// The AWS SDK's standard retryer makes up to 3 attempts of a request with up
// to 20 s between them, resending the same MessageDeduplicationId. The
// adapter turns it off for SendMessageBatch, whatever the client's own
// configuration: each SendBatch is exactly one HTTP request, so every resend
// is one the Publisher makes and counts in RetryPolicy.Span, and
// HiddenRetrySpan is zero. Receives, deletes, visibility changes and
// attribute reads keep the client's retryer, bounded by the caller's
// context; none of them resends a message.
//
// # Consumer
//
// Receive long-polls (WaitTimeSeconds 1 to 20, always sent, ending half a
// second before the context's deadline; with less time left it sends no
// request, since a WaitTimeSeconds of 0 is left out by the SDK and the
// queue's ReceiveMessageWaitTimeSeconds would apply) and tags each request
// with a ReceiveRequestAttemptId, so that an SDK retry of a lost response
// returns the same messages instead of hiding them. Delivery.Attempt is ApproximateReceiveCount and
// Delivery.Lease the visibility timeout.
//
// A Receive whose context is cancelled mid-poll abandons its request;
// a message that arrives for it before SQS notices stays hidden until its
// visibility timeout and then comes back with Attempt raised (fauxqs, the
// emulator the tests use, holds such a poll for its whole wait). A shorter
// Options.WaitTime narrows that gap at shutdown, at the cost of more
// requests.
//
// Ack deletes the message; acks made within Options.DeleteLinger of each
// other share one DeleteMessageBatch, and each gets its own entry's
// result. Nack and Extend change the message's visibility (whole seconds,
// at most 12 h).
//
// Terminate must stop redelivery, and SQS has no call that dead-letters a
// message at once (its redrive policy would hand the message to the
// handler again up to maxReceiveCount times). So on a queue with a
// RedrivePolicy the adapter moves the message itself: it sends it to the
// dead-letter queue unchanged (same MessageDeduplicationId and group, so a
// repeated move is dropped), with the reason in ReasonAttr cut to the room
// the dead-letter queue's MaximumMessageSize leaves, and then deletes it.
// On a queue without one, or with Options.TerminateDeletes, it deletes the
// message.
//
// The move needs the consumer's credentials to hold sqs:SendMessage on the
// dead-letter queue (sqs:GetQueueUrl to find it, sqs:GetQueueAttributes to
// read its MaximumMessageSize, else the source queue's is assumed; and
// kms:GenerateDataKey and kms:Decrypt on its key if it is SSE-KMS
// encrypted), and the dead-letter queue's MaximumMessageSize to be at
// least the source queue's. Without them Terminate fails with a
// *DeadLetterError naming the fix, once: it is not retryable. The message
// then stays, and SQS's redrive moves it after maxReceiveCount receives.
//
// The redelivery policy reported to the startup check is the visibility
// timeout, RedrivePolicy.maxReceiveCount (no redrive policy: unlimited) and
// Options.NackBackoff.
//
// # Creating queues on an emulator
//
// On AWS, queues are made with infrastructure as code, and the adapter
// only uses them. On an emulator (fauxqs, LocalStack), create=true
// (Options.Create) makes what the flow needs when it is missing, so that
// one URL runs it with no queue made by hand:
//
//	sqs://orders.fifo?region=us-east-1&endpoint=http://127.0.0.1:4566&create=true
//
// It makes a FIFO dead-letter queue named DeadLetterName(queue)
// ("orders-dlq.fifo"), then the FIFO queue with a VisibilityTimeout of
// ack_wait (default 30s) and a RedrivePolicy to the dead-letter
// queue with a maxReceiveCount of max_deliveries (default 5): a redelivery
// span of 2m30s by default, which any dedup Guard TTL of minutes covers.
// Nothing is created while opening: dedupq.NewPublisher and NewConsumer
// run the startup check on the queue as it will be, and call Provision
// only once it passed (driver.Provisioner), so a refused open leaves
// nothing behind. If the queue cannot be made, a dead-letter queue made
// for it moments ago is removed again, unless it is in use.
//
// A queue that exists is never changed: create=true checks that it is FIFO
// and has a RedrivePolicy (and, with max_deliveries, that maxReceiveCount),
// and fails with what to change otherwise. create=true is refused without
// endpoint=, with an AWS endpoint (*.amazonaws.com, *.api.aws and the other
// partitions' domains) and with a queue URL instead of a name; the error
// lists the attributes to give the queues on AWS.
package sqs
