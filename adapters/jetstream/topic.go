package jetstream

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
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

// Topic publishes to one subject of one stream. It implements driver.Topic
// and is safe for concurrent use.
type Topic struct {
	nc      *nats.Conn
	ownConn bool
	release func() // set by URLOpener: called once nc is closed
	// js serves the stream and window lookups; publishes go through
	// pubs.
	js       jetstream.JetStream
	cfg      Config
	maxBatch int
	// pubOpts are the publish options every message shares, made once: a
	// PublishOpt is a closure, and the variadic slice would be another
	// allocation per message. The dedup ID and the expected stream travel
	// as headers toNATS writes (what WithMsgID and WithExpectStream would
	// write), so no option differs between messages.
	pubOpts []jetstream.PublishOpt

	// provision serializes Provision; mu guards the fields below it.
	provision sync.Mutex
	mu        sync.Mutex
	stream    jetstream.Stream // nil until the stream exists (Provision)
	limits    driver.Limits

	// connClosed is closed once the connection is; publishes still
	// waiting for a PubAck then end instead of waiting for their context.
	connClosed chan struct{}
	statusCh   chan nats.Status
	closeOnce  sync.Once

	// pubs hold the idle publish contexts. A SendBatch takes one for
	// itself, so that every publish pending on it is that call's: the
	// call frees those whose PubAck did not come in its context
	// (CleanupPublisher) without touching another call's, and waits for
	// all the others on one channel (PublishAsyncComplete). The client's
	// own per-publish ack timer, which freed them before, is a timer and
	// a closure per message. pubsClosed is set by Close, after which a
	// returned context is cleaned up rather than kept.
	pubsMu     sync.Mutex
	pubs       []jetstream.JetStream
	pubsClosed bool
}

var (
	_ driver.Topic        = (*Topic)(nil)
	_ driver.Provisioner  = (*Topic)(nil)
	_ driver.BatchStarter = (*Topic)(nil)
)

// OpenTopic opens the stream cfg names on nc and checks that it can take
// cfg.Subject and its group suffixes. A missing stream is an error unless
// cfg.CreateStream: then Provision creates it (dedupq.NewPublisher calls it
// once its startup check passed; see driver.Provisioner), and until then
// Window reports the window it will have. nc stays the caller's: Close
// leaves it open. nc must not buffer
// publishes while reconnecting (dial it with nats.ReconnectBufSize(-1)),
// because a buffered message is sent whenever the connection returns, a
// resend outside every retry policy and window.
func OpenTopic(ctx context.Context, nc *nats.Conn, cfg Config) (*Topic, error) {
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
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	stream, err := lookupStream(ctx, js, &cfg)
	if err != nil {
		return nil, err
	}
	if stream != nil {
		if err := checkTopicStream(cfg, stream.CachedInfo()); err != nil {
			return nil, err
		}
	}
	t := &Topic{
		nc: nc, ownConn: ownConn, js: js, cfg: cfg,
		maxBatch: maxBatch,
		// The portable layer owns retries; the client's own would be
		// hidden from the span check.
		pubOpts:    []jetstream.PublishOpt{jetstream.WithRetryAttempts(0)},
		connClosed: make(chan struct{}),
		statusCh:   nc.StatusChanged(nats.CLOSED),
	}
	t.setStream(stream)
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

// checkTopicStream checks that the stream takes cfg.Subject and its group
// suffixes.
func checkTopicStream(cfg Config, info *jetstream.StreamInfo) error {
	for _, need := range []struct{ subject, use string }{
		{cfg.Subject, "publishing without a GroupKey"},
		{cfg.Subject + ".*", "publishing with a GroupKey"},
	} {
		if !covers(info.Config.Subjects, need.subject) {
			return fmt.Errorf("jetstream: stream %s (subjects %v) does not take %q, which %s needs; add %q to the stream's subjects",
				cfg.Stream, info.Config.Subjects, need.subject, need.use, strings.Replace(need.subject, "*", ">", 1))
		}
	}
	return nil
}

// setStream records the stream (nil: not created yet) and the limits it
// gives: the connection's max_payload, or the stream's MaxMsgSize when
// smaller. The stream Provision creates has no MaxMsgSize.
func (t *Topic) setStream(stream jetstream.Stream) {
	maxPayload := t.nc.MaxPayload()
	if stream != nil {
		if s := int64(stream.CachedInfo().Config.MaxMsgSize); s > 0 && s < maxPayload {
			maxPayload = s
		}
	}
	t.mu.Lock()
	t.stream, t.limits = stream, limits(t.cfg.Stream, maxPayload)
	t.mu.Unlock()
}

func (t *Topic) currentStream() jetstream.Stream {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stream
}

// Provision creates the stream when it is missing (only with
// cfg.CreateStream; otherwise opening failed already). A stream another
// process created meanwhile is used when it fits, as at open. See
// driver.Provisioner.
func (t *Topic) Provision(ctx context.Context) error {
	t.provision.Lock()
	defer t.provision.Unlock()
	if t.currentStream() != nil {
		return nil
	}
	stream, _, err := createStream(ctx, t.js, &t.cfg)
	if err != nil {
		return err
	}
	// Only a stream another process created first can fail this (ours
	// takes the subjects), and that one is theirs to keep.
	if err := checkTopicStream(t.cfg, stream.CachedInfo()); err != nil {
		return err
	}
	t.setStream(stream)
	return nil
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// takePublisher returns an idle publish context, or a new one.
func (t *Topic) takePublisher() (jetstream.JetStream, error) {
	t.pubsMu.Lock()
	if n := len(t.pubs); n > 0 {
		js := t.pubs[n-1]
		t.pubs = t.pubs[:n-1]
		t.pubsMu.Unlock()
		return js, nil
	}
	t.pubsMu.Unlock()
	// Room for a whole batch: a publish never stalls for a slot, which
	// only this call's own publishes could hold.
	return jetstream.New(t.nc, jetstream.WithPublishAsyncMaxPending(t.maxBatch))
}

// givePublisher takes back a publish context. One with publishes still
// pending (abandoned: their PubAck did not come in time) is cleaned up,
// which frees them and drops its reply subscription, and is not reused:
// a late PubAck for it could otherwise meet a new publish that drew the
// same reply token.
func (t *Topic) givePublisher(js jetstream.JetStream, abandoned bool) {
	t.pubsMu.Lock()
	if !abandoned && !t.pubsClosed {
		t.pubs = append(t.pubs, js)
		t.pubsMu.Unlock()
		return
	}
	t.pubsMu.Unlock()
	js.CleanupPublisher()
}

// SendBatch publishes every message asynchronously, then waits for the
// PubAcks. A message's result is its own: one refused message does not
// fail the others, and a message whose PubAck did not come before ctx
// ended is reported retryable, since the stream may have stored it; the
// client forgets it when SendBatch returns.
func (t *Topic) SendBatch(ctx context.Context, msgs []*driver.Message) ([]driver.SendResult, error) {
	// Not through StartBatch's wait, a closure per call.
	js, futures, res, err := t.publishBatch(ctx, msgs)
	if err != nil || js == nil {
		return res, err
	}
	return t.awaitBatch(ctx, js, futures, res), nil
}

// StartBatch is SendBatch's first half: it publishes every message and
// returns once the connection has them; wait is the second half, which
// waits for their PubAcks. Every publish goes through the one connection
// in call order, so a batch started before another reaches the server
// first (driver.BatchStarter).
func (t *Topic) StartBatch(ctx context.Context, msgs []*driver.Message) (wait func() ([]driver.SendResult, error), err error) {
	js, futures, res, err := t.publishBatch(ctx, msgs)
	switch {
	case err != nil:
		return nil, err
	case js == nil:
		return func() ([]driver.SendResult, error) { return res, nil }, nil
	}
	return func() ([]driver.SendResult, error) { return t.awaitBatch(ctx, js, futures, res), nil }, nil
}

// publishBatch publishes msgs on a publish context of its own, returned
// with a future per published message; js is nil when none was published
// (res then holds every message's result).
func (t *Topic) publishBatch(ctx context.Context, msgs []*driver.Message) (js jetstream.JetStream, futures []jetstream.PubAckFuture, res []driver.SendResult, err error) {
	if len(msgs) > t.maxBatch {
		return nil, nil, nil, fmt.Errorf("jetstream: batch of %d messages exceeds MaxBatch %d", len(msgs), t.maxBatch)
	}
	if t.currentStream() == nil {
		// Used without dedupq.NewPublisher, which provisions first.
		if err := t.Provision(ctx); err != nil {
			return nil, nil, nil, err
		}
	}
	js, err = t.takePublisher()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	res = make([]driver.SendResult, len(msgs))
	futures = make([]jetstream.PubAckFuture, len(msgs))
	sent := false
	for i, m := range msgs {
		if err := ctx.Err(); err != nil {
			res[i].Err = context.Cause(ctx)
			continue
		}
		if err := checkMessage(m); err != nil {
			res[i].Err = err
			continue
		}
		f, err := js.PublishMsgAsync(toNATS(t.cfg.Subject, t.cfg.Stream, m), t.pubOpts...)
		if err != nil {
			// Not handed to the connection: what err says is the truth.
			res[i].Err = fmt.Errorf("jetstream: publish: %w", err)
			continue
		}
		futures[i], sent = f, true
	}
	if !sent {
		t.givePublisher(js, false)
		return nil, nil, res, nil
	}
	return js, futures, res, nil
}

// awaitBatch waits for the PubAcks of the publishes a StartBatch made on
// js, fills res with them, and gives js back.
func (t *Topic) awaitBatch(ctx context.Context, js jetstream.JetStream, futures []jetstream.PubAckFuture, res []driver.SendResult) []driver.SendResult {
	// The context's pending publishes are this call's alone, so its
	// completion is the last of them answered.
	var gaveUp error
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		gaveUp = context.Cause(ctx)
	case <-t.connClosed:
		gaveUp = nats.ErrConnectionClosed
	}
	abandoned := false
	for i, f := range futures {
		if f == nil {
			continue
		}
		// An answer that is there wins over a context that ended
		// meanwhile. Err is asked for only when Ok has nothing: each
		// makes a channel.
		select {
		case ack := <-f.Ok():
			res[i] = ackResult(ack)
			continue
		default:
		}
		select {
		case err := <-f.Err():
			res[i].Err = pubAckError(err)
		default:
			abandoned = true
			res[i].Err = &noAnswerError{cmp.Or(gaveUp, errNoPubAck)}
		}
	}
	t.givePublisher(js, abandoned)
	return res
}

// errNoPubAck stands for a PubAck missing although the client reported
// every publish answered, which it should never do.
var errNoPubAck = errors.New("jetstream: the client reported a publish answered but holds no answer for it")

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
// (or the stream's MaxMsgSize when smaller) as read at open or Provision.
func (t *Topic) Limits() driver.Limits {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.limits
}

// Window reads the stream's dedup window from the server; before Provision
// created the stream, the window it will be created with.
func (t *Topic) Window(ctx context.Context) (window.Window, error) {
	return currentWindow(ctx, t.js, t.currentStream(), t.cfg)
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
		t.pubsMu.Lock()
		idle := t.pubs
		t.pubs, t.pubsClosed = nil, true
		t.pubsMu.Unlock()
		// Their reply subscriptions would stay on a connection the
		// caller keeps.
		for _, js := range idle {
			js.CleanupPublisher()
		}
		t.nc.RemoveStatusListener(t.statusCh)
		if t.ownConn {
			t.nc.Close()
		}
		if t.release != nil {
			t.release()
		}
	})
	return nil
}

// lookupStream looks the stream up and checks cfg.Duplicates against it.
// A missing stream is an error, unless cfg.CreateStream: then it returns
// nil and no error, and createStream makes the stream once the startup
// check passed.
func lookupStream(ctx context.Context, js jetstream.JetStream, cfg *Config) (jetstream.Stream, error) {
	stream, err := js.Stream(ctx, cfg.Stream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && cfg.CreateStream:
		return nil, nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("jetstream: stream %s does not exist (create it, or set create=true / Config.CreateStream): %w", cfg.Stream, err)
	case err != nil:
		return nil, fmt.Errorf("jetstream: opening stream %s: %w", cfg.Stream, err)
	}
	return stream, checkStream(stream, cfg)
}

// createStream creates the stream cfg names. created is true only when the
// stream is provably this call's: false when another process created it
// first (that stream is then checked like one found at open, and is not
// this process's to remove), and also on servers before 2.10, which keep
// no stream metadata and so cannot tell.
func createStream(ctx context.Context, js jetstream.JetStream, cfg *Config) (stream jetstream.Stream, created bool, err error) {
	sc := streamConfig(cfg)
	// The server answers a create of a stream that exists with the same
	// configuration as if it had made it. A token of this create's own
	// makes every other create's configuration differ, so that the answer
	// tells whether this process made the stream, and may remove it.
	var token [8]byte
	_, _ = rand.Read(token[:])
	sc.Metadata = map[string]string{creatorKey: hex.EncodeToString(token[:])}
	stream, err = js.CreateStream(ctx, sc)
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// Created by someone else meanwhile: use theirs.
		stream, err = js.Stream(ctx, cfg.Stream)
		if err != nil {
			return nil, false, fmt.Errorf("jetstream: opening stream %s: %w", cfg.Stream, err)
		}
		return stream, false, checkStream(stream, cfg)
	}
	if err != nil {
		return nil, false, fmt.Errorf("jetstream: creating stream %s: %w", cfg.Stream, err)
	}
	created = stream.CachedInfo().Config.Metadata[creatorKey] == sc.Metadata[creatorKey]
	return stream, created, nil
}

// creatorKey is the stream metadata key under which createStream leaves
// the token of the create that made the stream.
const creatorKey = "dedupq.creator"

// streamConfig is the stream createStream makes, without its token.
func streamConfig(cfg *Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:       cfg.Stream,
		Subjects:   []string{cfg.Subject, cfg.Subject + ".>"},
		Storage:    cfg.Storage,
		Duplicates: cfg.Duplicates,
	}
}

// checkStream checks cfg.Duplicates against a stream.
func checkStream(stream jetstream.Stream, cfg *Config) error {
	if got := stream.CachedInfo().Config.Duplicates; cfg.Duplicates != 0 && got != cfg.Duplicates {
		return fmt.Errorf("jetstream: stream %s has a dedup window (Duplicates) of %s, not the %s configured; change one of them", cfg.Stream, window.FormatDuration(got), window.FormatDuration(cfg.Duplicates))
	}
	return nil
}

// removeCreatedStream deletes a stream this process created moments ago
// for an open whose next step failed, unless something uses it already
// (messages stored, a consumer made by another process): then it stays,
// and the error says so. ctx may be the one that ran out; the removal gets
// its own bound.
func removeCreatedStream(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	name := stream.CachedInfo().Config.Name
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("jetstream: stream %s, created for this open, is left in place: reading it: %w", name, err)
	}
	if n, c := info.State.Msgs, info.State.Consumers; n > 0 || c > 0 {
		return fmt.Errorf("jetstream: stream %s, created for this open, is left in place: it is in use already (%d messages, %d consumers)", name, n, c)
	}
	if err := js.DeleteStream(ctx, name); err != nil {
		return fmt.Errorf("jetstream: stream %s, created for this open, is left in place: deleting it: %w", name, err)
	}
	return nil
}

// currentWindow is the window of stream, or, while it is nil (not yet
// created), of the stream cfg names: the live one if another process
// created it meanwhile, else the one createStream will make.
func currentWindow(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, cfg Config) (window.Window, error) {
	if stream == nil {
		s, err := js.Stream(ctx, cfg.Stream)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			return plannedWindow(cfg), nil
		case err != nil:
			return window.Window{}, fmt.Errorf("jetstream: reading stream info: %w", err)
		}
		stream = s
	}
	return streamWindow(ctx, js, stream)
}

// settings name where a user changes what the startup check reads here.
// Config, or the URL, states the stream's and the durable's settings: they
// are used when this package creates the entity and must match it
// otherwise, so a change is made on the server and in Config alike.
// BackOff is not named on its own: Redelivery folds it into AckWait.
func settings() window.Settings {
	return window.Settings{
		Window:        "the stream's Duplicates (Config.Duplicates, URL parameter window)",
		AckWait:       "the durable's AckWait and every BackOff entry above it (Config.AckWait and BackOff, URL parameters ack_wait and backoff)",
		MaxDeliveries: "the durable's MaxDeliver (Config.MaxDeliver, URL parameter max_deliveries)",
	}
}

// plannedWindow is the window of the stream createStream makes: its
// Duplicates, or the server's default.
func plannedWindow(cfg Config) window.Window {
	w := window.Window{
		Backend:  "jetstream",
		Duration: cfg.Duplicates,
		Kind:     window.KindConfigured,
		Source:   window.SourceConfigured,
		Scope:    "stream " + cfg.Stream + ", to be created",
		Settings: settings(),
	}
	if w.Duration == 0 {
		w.Duration, w.Source = DefaultWindow, window.SourceDocumented
	}
	return w
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
		Settings: settings(),
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
				w.Settings.Window = fmt.Sprintf("the Duplicates of stream %s, which %s mirrors", m.Name, info.Config.Name)
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
