package jetstream

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// noAnswerError marks a message that was handed to the connection but got
// no PubAck: the stream may have stored it, so a resend (with the same ID)
// is the right move whatever the cause says.
type noAnswerError struct{ err error }

func (e *noAnswerError) Error() string {
	return "jetstream: no publish acknowledgement, the message may have been stored: " + e.err.Error()
}

func (e *noAnswerError) Unwrap() error { return e.err }

// isRetryable is the classification shared by Topic and Subscription.
//
// True: no answer arrived (timeouts, a cancelled context, a dropped or
// reconnecting connection, no servers to reconnect to yet, no responders,
// an unreadable reply), the client refused to queue for a moment (too many
// pending publishes, no reconnect buffer), or the server ended a pull
// because it is shutting down or its consumer changed leader: a restarting
// server comes back, and the durable with it. Also true for a JetStream
// API error with a 5xx or 408 code, which means "not now" (cluster without
// a leader, JetStream temporarily unavailable).
//
// False: a JetStream API error with any other code (4xx: the stream
// refused the message — wrong stream, too large, limits reached), and
// client-side refusals (payload too large, bad subject or header, closed
// connection, invalid option). A closed nats.Conn never reconnects.
func isRetryable(err error) bool {
	if err == nil {
		return false
	}
	var na *noAnswerError
	if errors.As(err, &na) {
		return true
	}
	var rf *refusedError
	if errors.As(err, &rf) {
		return false
	}
	var jse jetstream.JetStreamError
	if errors.As(err, &jse) && jse.APIError() != nil {
		code := jse.APIError().Code
		return code == 408 || code >= 500
	}
	for _, target := range []error{
		context.DeadlineExceeded, context.Canceled,
		nats.ErrTimeout, nats.ErrNoResponders, nats.ErrDisconnected,
		nats.ErrConnectionReconnecting, nats.ErrReconnectBufExceeded,
		nats.ErrStaleConnection, nats.ErrSlowConsumer, nats.ErrNoServers,
		jetstream.ErrNoStreamResponse, jetstream.ErrAsyncPublishTimeout,
		jetstream.ErrTooManyStalledMsgs, jetstream.ErrNoHeartbeat,
		jetstream.ErrInvalidJSAck, jetstream.ErrServerShutdown,
		jetstream.ErrConsumerLeadershipChanged, io.EOF, io.ErrUnexpectedEOF,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne)
}
