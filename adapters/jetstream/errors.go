package jetstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

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

// DurableError is an existing durable consumer whose configuration the
// adapter cannot consume with, as found when a Subscription opens or when
// a pull refused for a limit made it read the durable again. Problems say
// what is wrong and how to fix it, one each.
type DurableError struct {
	Stream, Durable string
	Problems        []string
}

func (e *DurableError) Error() string {
	return fmt.Sprintf("jetstream: durable consumer %s on stream %s does not fit: %s; change or delete it",
		e.Durable, e.Stream, strings.Join(e.Problems, "; "))
}

// pullLimitError is a pull the durable refused for one of its request
// limits: the server answers 409 "Exceeded MaxWaiting" (that many pulls
// wait already), "Exceeded MaxRequestExpires of …", "Exceeded
// MaxRequestBatch of …" or "Exceeded MaxRequestMaxBytes of …", which the
// client hands on as a bare error with the server's text.
//
// It is transient. MaxWaiting: the waiting pulls expire or are served. A
// request limit: Receive fits its pulls to the durable's limits as read at
// open, so a refusal means an operator lowered one since; Receive has read
// the durable again before returning this (a durable no longer usable is
// a *DurableError instead), and its next pull fits.
type pullLimitError struct {
	setting string // MaxWaiting, MaxRequestExpires, MaxRequestBatch or MaxRequestMaxBytes
	err     error
}

func (e *pullLimitError) Error() string {
	return "the durable refused the pull for its " + e.setting + ": " + e.err.Error()
}

func (e *pullLimitError) Unwrap() error { return e.err }

// asPullLimit returns err as a *pullLimitError when it is the client's
// rendering of a pull refused for a request limit, else err.
func asPullLimit(err error) error {
	rest, ok := strings.CutPrefix(err.Error(), "nats: Exceeded ")
	if !ok {
		return err
	}
	setting, _, _ := strings.Cut(rest, " ")
	switch setting {
	case "MaxWaiting", "MaxRequestExpires", "MaxRequestBatch", "MaxRequestMaxBytes":
		return &pullLimitError{setting: setting, err: err}
	}
	return err
}

// isRetryable is the classification shared by Topic and Subscription.
//
// True: no answer arrived (timeouts, a cancelled context, a dropped or
// reconnecting connection, no servers to reconnect to yet, no responders,
// an unreadable reply), the client refused to queue for a moment (too many
// pending publishes, no reconnect buffer), or the server ended a pull
// because it is shutting down or its consumer changed leader: a restarting
// server comes back, and the durable with it. Also true for a JetStream
// API error with a 5xx or 408 code, which means "not now" (cluster without
// a leader, JetStream temporarily unavailable), and for a pull the durable
// refused for one of its request limits (see pullLimitError).
//
// False: a JetStream API error with any other code (4xx: the stream
// refused the message — wrong stream, too large, limits reached), and
// client-side refusals (payload too large, bad subject or header, closed
// connection, invalid option), and a *DurableError. A closed nats.Conn
// never reconnects.
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
	var de *DurableError
	if errors.As(err, &de) {
		return false
	}
	var pl *pullLimitError
	if errors.As(err, &pl) {
		return true
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
