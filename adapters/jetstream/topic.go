package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// DefaultWindow is the server's default stream Duplicates, assumed only
// when a stream reports none.
const DefaultWindow = 2 * time.Minute

// asyncAckTimeout bounds how long the client remembers a publish whose
// PubAck never came, after SendBatch stopped waiting for it. It only frees
// memory and pending slots; SendBatch itself waits as long as its context.
const asyncAckTimeout = time.Minute

// Topic publishes to one subject of one stream. It implements driver.Topic
// and is safe for concurrent use.
type Topic struct {
	nc       *nats.Conn
	ownConn  bool
	js       jetstream.JetStream
	stream   jetstream.Stream
	cfg      Config
	limits   driver.Limits
	maxBatch int

	// connClosed is closed once the connection is; publishes still
	// waiting for a PubAck then end instead of waiting for their context.
	connClosed chan struct{}
	statusCh   chan nats.Status
	closeOnce  sync.Once
}

var _ driver.Topic = (*Topic)(nil)

// NewTopic opens the stream cfg names on nc (creating it if
// cfg.CreateStream) and checks that it can take cfg.Subject and its group
// suffixes. nc stays the caller's: Close leaves it open. nc must not buffer
// publishes while reconnecting (dial it with nats.ReconnectBufSize(-1)),
// because a buffered message is sent whenever the connection returns, a
// resend outside every retry policy and window.
func NewTopic(ctx context.Context, nc *nats.Conn, cfg Config) (*Topic, error) {
	if nc.Opts.ReconnectBufSize >= 0 {
		return nil, errors.New("jetstream: the connection buffers publishes while reconnecting, which can resend a message after its dedup window; dial it with nats.ReconnectBufSize(-1)")
	}
	return newTopic(ctx, nc, cfg, false)
}

func newTopic(ctx context.Context, nc *nats.Conn, cfg Config, ownConn bool) (*Topic, error) {
	if err := cfg.validate(false); err != nil {
		return nil, err
	}
	if !nc.HeadersSupported() {
		return nil, errors.New("jetstream: the server does not support headers, which carry the dedup ID")
	}
	maxBatch := cmpOr(cfg.MaxBatch, DefaultMaxBatch)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(asyncAckTimeout),
		// Room for a whole batch while the previous one's stragglers are
		// still pending, so that publishing never stalls inside a batch.
		jetstream.WithPublishAsyncMaxPending(max(4000, 2*maxBatch)))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	stream, err := openStream(ctx, js, &cfg)
	if err != nil {
		return nil, err
	}
	info := stream.CachedInfo()
	for _, need := range []struct{ subject, use string }{
		{cfg.Subject, "publishing without a GroupKey"},
		{cfg.Subject + ".*", "publishing with a GroupKey"},
	} {
		if !covers(info.Config.Subjects, need.subject) {
			return nil, fmt.Errorf("jetstream: stream %s (subjects %v) does not take %q, which %s needs; add %q to the stream's subjects",
				cfg.Stream, info.Config.Subjects, need.subject, need.use, strings.Replace(need.subject, "*", ">", 1))
		}
	}
	maxPayload := nc.MaxPayload()
	if s := int64(info.Config.MaxMsgSize); s > 0 && s < maxPayload {
		maxPayload = s
	}
	t := &Topic{
		nc: nc, ownConn: ownConn, js: js, stream: stream, cfg: cfg,
		limits:     limits(cfg.Stream, maxPayload),
		maxBatch:   maxBatch,
		connClosed: make(chan struct{}),
		statusCh:   nc.StatusChanged(nats.CLOSED),
	}
	go func() {
		// Fires on CLOSED, and also when Close removes the listener.
		<-t.statusCh
		close(t.connClosed)
	}()
	if nc.IsClosed() {
		t.Close()
		return nil, nats.ErrConnectionClosed
	}
	return t, nil
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// SendBatch publishes every message asynchronously, then waits for each
// PubAck. A message's result is its own: one refused message does not fail
// the others, and a message whose PubAck did not come before ctx ended is
// reported retryable, since the stream may have stored it.
func (t *Topic) SendBatch(ctx context.Context, msgs []*driver.Message) ([]driver.SendResult, error) {
	if len(msgs) > t.maxBatch {
		return nil, fmt.Errorf("jetstream: batch of %d messages exceeds MaxBatch %d", len(msgs), t.maxBatch)
	}
	res := make([]driver.SendResult, len(msgs))
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		if err := ctx.Err(); err != nil {
			res[i].Err = context.Cause(ctx)
			continue
		}
		if err := checkMessage(m); err != nil {
			res[i].Err = err
			continue
		}
		f, err := t.js.PublishMsgAsync(toNATS(t.cfg.Subject, m),
			jetstream.WithMsgID(m.ID),
			// The stream we checked the window of is the one that must
			// store the message.
			jetstream.WithExpectStream(t.cfg.Stream),
			// The portable layer owns retries; the client's own would be
			// hidden from the span check.
			jetstream.WithRetryAttempts(0))
		if err != nil {
			// Not handed to the connection: what err says is the truth.
			res[i].Err = fmt.Errorf("jetstream: publish: %w", err)
			continue
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f != nil {
			res[i] = t.await(ctx, f)
		}
	}
	return res, nil
}

// await waits for one PubAck.
func (t *Topic) await(ctx context.Context, f jetstream.PubAckFuture) driver.SendResult {
	ok, errc := f.Ok(), f.Err()
	// An answer that is already there wins over a context that ended
	// meanwhile.
	select {
	case ack := <-ok:
		return ackResult(ack)
	case err := <-errc:
		return driver.SendResult{Err: pubAckError(err)}
	default:
	}
	select {
	case ack := <-ok:
		return ackResult(ack)
	case err := <-errc:
		return driver.SendResult{Err: pubAckError(err)}
	case <-ctx.Done():
		return driver.SendResult{Err: &noAnswerError{context.Cause(ctx)}}
	case <-t.connClosed:
		return driver.SendResult{Err: &noAnswerError{nats.ErrConnectionClosed}}
	}
}

func ackResult(ack *jetstream.PubAck) driver.SendResult {
	return driver.SendResult{BackendID: strconv.FormatUint(ack.Sequence, 10), Duplicate: ack.Duplicate}
}

// pubAckError marks the errors that leave a message in doubt; an API error
// is the stream's own refusal and stays as it is.
func pubAckError(err error) error {
	var jse jetstream.JetStreamError
	if errors.As(err, &jse) && jse.APIError() != nil {
		return fmt.Errorf("jetstream: stream refused the message: %w", err)
	}
	return &noAnswerError{err}
}

// MaxBatch is Config.MaxBatch, or DefaultMaxBatch.
func (t *Topic) MaxBatch() int { return t.maxBatch }

// Limits are this backend's rules, sized to the connection's max_payload
// (or the stream's MaxMsgSize when smaller) as read at open.
func (t *Topic) Limits() driver.Limits { return t.limits }

// Window reads the stream's dedup window from the server.
func (t *Topic) Window(ctx context.Context) (window.Window, error) {
	return streamWindow(ctx, t.js, t.stream)
}

// HiddenRetrySpan is zero: the client's own publish retries are switched
// off and the connection keeps no reconnect buffer.
func (t *Topic) HiddenRetrySpan() time.Duration { return 0 }

// IsRetryable reports whether a send may succeed if repeated; see the
// package doc for the classification.
func (t *Topic) IsRetryable(err error) bool { return isRetryable(err) }

// Close releases the topic, and the connection when the topic dialled it.
func (t *Topic) Close() error {
	t.closeOnce.Do(func() {
		t.nc.RemoveStatusListener(t.statusCh)
		if t.ownConn {
			t.nc.Close()
		}
	})
	return nil
}

// openStream looks the stream up, creating it when cfg says so, and checks
// cfg.Duplicates against it.
func openStream(ctx context.Context, js jetstream.JetStream, cfg *Config) (jetstream.Stream, error) {
	stream, err := js.Stream(ctx, cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) && cfg.CreateStream {
		stream, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:       cfg.Stream,
			Subjects:   []string{cfg.Subject, cfg.Subject + ".>"},
			Storage:    cfg.Storage,
			Duplicates: cfg.Duplicates,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Created by someone else meanwhile: use theirs.
			stream, err = js.Stream(ctx, cfg.Stream)
		}
	}
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("jetstream: stream %s does not exist (create it, or set create=true / Config.CreateStream): %w", cfg.Stream, err)
	case err != nil:
		return nil, fmt.Errorf("jetstream: opening stream %s: %w", cfg.Stream, err)
	}
	if got := stream.CachedInfo().Config.Duplicates; cfg.Duplicates != 0 && got != cfg.Duplicates {
		return nil, fmt.Errorf("jetstream: stream %s has a dedup window (Duplicates) of %s, not the %s configured; change one of them", cfg.Stream, got, cfg.Duplicates)
	}
	return stream, nil
}

// streamWindow reads the live window of stream.
func streamWindow(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream) (window.Window, error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return window.Window{}, fmt.Errorf("jetstream: reading stream info: %w", err)
	}
	w := window.Window{
		Backend:  "jetstream",
		Duration: info.Config.Duplicates,
		Kind:     window.KindConfigured,
		Source:   window.SourceDiscovered,
		Scope:    "stream " + info.Config.Name,
	}
	if w.Duration > 0 {
		return w, nil
	}
	// The server leaves a mirror without a window of its own: its messages
	// were deduplicated when published to the stream it copies.
	if m := info.Config.Mirror; m != nil && m.Domain == "" && m.External == nil {
		if origin, err := js.Stream(ctx, m.Name); err == nil {
			if d := origin.CachedInfo().Config.Duplicates; d > 0 {
				w.Duration, w.Scope = d, fmt.Sprintf("stream %s (mirrored by %s)", m.Name, info.Config.Name)
				return w, nil
			}
		}
	}
	w.Duration, w.Source = DefaultWindow, window.SourceDocumented
	return w, nil
}

// covers reports whether the stream subjects take every subject that
// subject matches; a "*" token in subject stands for any one token.
func covers(patterns []string, subject string) bool {
	want := strings.Split(subject, ".")
	for _, p := range patterns {
		if matchTokens(strings.Split(p, "."), want) {
			return true
		}
	}
	return false
}

// matchTokens reports whether pattern tokens match every subject that the
// subject tokens stand for.
func matchTokens(pat, subj []string) bool {
	for i, p := range pat {
		if p == ">" {
			return i < len(subj)
		}
		if i >= len(subj) || (p != "*" && p != subj[i]) {
			return false
		}
	}
	return len(pat) == len(subj)
}
