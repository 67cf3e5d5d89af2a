package servicebus

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"

	"github.com/dedupq/dedupq/driver"
)

// sessionReceiver is the part of *azservicebus.SessionReceiver a
// Subscription uses; the SDK's type implements it as it is.
type sessionReceiver interface {
	SessionID() string
	LockedUntil() time.Time
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, m *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error
	DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error
	RenewSessionLock(ctx context.Context, options *azservicebus.RenewSessionLockOptions) error
	Close(ctx context.Context) error
}

var _ sessionReceiver = (*azservicebus.SessionReceiver)(nil)

// sessionAcceptor accepts the next available session of one entity.
type sessionAcceptor interface {
	// AcceptNext locks the next session with messages available, waiting
	// for one until ctx ends.
	AcceptNext(ctx context.Context) (sessionReceiver, error)
	// Close releases what the acceptor owns (the URL opener's client).
	Close(ctx context.Context) error
}

// sdkAcceptor accepts sessions through an SDK client.
type sdkAcceptor struct {
	client *azservicebus.Client
	entity Entity
	owned  bool // the client is closed with the acceptor
}

func (a sdkAcceptor) AcceptNext(ctx context.Context) (sessionReceiver, error) {
	opts := &azservicebus.SessionReceiverOptions{ReceiveMode: azservicebus.ReceiveModePeekLock}
	var r *azservicebus.SessionReceiver
	var err error
	if a.entity.Queue != "" {
		r, err = a.client.AcceptNextSessionForQueue(ctx, a.entity.Queue, opts)
	} else {
		r, err = a.client.AcceptNextSessionForSubscription(ctx, a.entity.Topic, a.entity.Subscription, opts)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (a sdkAcceptor) Close(ctx context.Context) error {
	if !a.owned {
		return nil
	}
	return a.client.Close(ctx)
}

const (
	// DefaultSessionIdle is how long a session is kept with nothing of it
	// in flight and no new message before it is released
	// (Options.SessionIdle), for another process, or another session, to
	// take its place.
	DefaultSessionIdle = time.Second
	// acceptWait bounds one wait for the next available session; the SDK
	// tells the broker the same bound (com.microsoft:timeout), and a wait
	// that ends without a session simply starts again.
	acceptWait = time.Minute
)

// sessionPool receives from a session entity: it holds up to limit
// sessions at once (the largest number of deliveries a Receive asked
// for, so at most the Consumer's Concurrency), accepting the next
// available one while it holds fewer and a Receive is waiting. Each
// session has one delivery out at a time: its next message is received
// only once the one before it is settled, so Receive returns every
// session's messages in the session's order, and a message that was
// abandoned comes again before the later ones (Service Bus puts it back
// at its place in the session). A session is released when it has been
// idle for SessionIdle, when its lock is lost, and on Close.
type sessionPool struct {
	acc    sessionAcceptor
	entity Entity
	idle   time.Duration
	lease  func() time.Duration // the entity's LockDuration, as last read

	ctx    context.Context // ends with Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	limit     int
	held      map[*session]struct{}
	accepting bool
	waiters   int                // Receive calls waiting
	ready     []*driver.Delivery // received, not yet returned by Receive
	acceptErr error              // an accept's failure, for the next Receive
	wake      chan struct{}      // closed and replaced on every change above
	closed    bool
}

// session is one accepted session.
type session struct {
	p      *sessionPool
	sr     sessionReceiver
	id     string
	ctx    context.Context // ends when the session is released
	cancel context.CancelFunc

	// Guarded by p.mu.
	out         bool      // a delivery of the session is not settled yet
	lockedUntil time.Time // as the SDK last reported it
	changed     chan struct{}
}

// sessionMessage is the Handle of a delivery from a session.
type sessionMessage struct {
	s *session
	m *azservicebus.ReceivedMessage
}

func newSessionPool(acc sessionAcceptor, entity Entity, idle time.Duration, lease func() time.Duration) *sessionPool {
	if idle <= 0 {
		idle = DefaultSessionIdle
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &sessionPool{
		acc: acc, entity: entity, idle: idle, lease: lease, ctx: ctx, cancel: cancel,
		held: map[*session]struct{}{}, wake: make(chan struct{}),
	}
}

// signal wakes the waiting Receive calls; p.mu is held.
func (p *sessionPool) signal() {
	close(p.wake)
	p.wake = make(chan struct{})
}

// receive returns up to n deliveries, received from the sessions held,
// waiting until there is one, an accept failed, or ctx ends.
func (p *sessionPool) receive(ctx context.Context, n int) ([]*driver.Delivery, error) {
	n = max(n, 1)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.limit = max(p.limit, n)
	p.waiters++
	defer func() { p.waiters-- }()
	if p.waiters == 1 {
		p.signal() // the sessions held may take a message now
	}
	for {
		switch {
		case p.closed:
			return nil, ErrClosed
		case len(p.ready) > 0:
			k := min(n, len(p.ready))
			out := append([]*driver.Delivery(nil), p.ready[:k]...)
			p.ready = p.ready[k:]
			return out, nil
		case p.acceptErr != nil:
			err := p.acceptErr
			p.acceptErr = nil
			return nil, err
		}
		if !p.accepting && len(p.held) < p.limit {
			p.accepting = true
			p.wg.Add(1)
			go p.accept()
		}
		wake := p.wake
		p.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
		}
		p.mu.Lock()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}

// accept takes the next available session while fewer than limit are
// held and a Receive waits; it ends on an error other than "no session
// available yet", which the next Receive returns.
func (p *sessionPool) accept() {
	defer p.wg.Done()
	for {
		ctx, cancel := context.WithTimeout(p.ctx, acceptWait)
		sr, err := p.acc.AcceptNext(ctx)
		timedOut := ctx.Err() != nil
		cancel()
		p.mu.Lock()
		switch {
		case p.closed || p.ctx.Err() != nil:
			p.accepting = false
			p.mu.Unlock()
			if sr != nil {
				p.closeReceiver(sr)
			}
			return
		case err == nil:
			p.start(sr)
		case !timedOut && !isNoSession(err):
			p.acceptErr = err
			p.accepting = false
			p.signal()
			p.mu.Unlock()
			return
		}
		if len(p.held) >= p.limit || p.waiters == 0 {
			p.accepting = false
			p.mu.Unlock()
			return
		}
		p.mu.Unlock()
	}
}

// isNoSession reports an accept that ended because no session was
// available within its wait.
func isNoSession(err error) bool {
	var sbErr *azservicebus.Error
	return errors.As(err, &sbErr) && sbErr.Code == azservicebus.CodeTimeout
}

// start holds a newly accepted session; p.mu is held.
func (p *sessionPool) start(sr sessionReceiver) {
	ctx, cancel := context.WithCancel(p.ctx)
	s := &session{p: p, sr: sr, id: sr.SessionID(), ctx: ctx, cancel: cancel, lockedUntil: sr.LockedUntil(), changed: make(chan struct{})}
	p.held[s] = struct{}{}
	p.wg.Add(2)
	go s.receive()
	go s.keep()
}

// touch records a change of s.out or s.lockedUntil; p.mu is held.
func (s *session) touch() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// receive takes the session's messages one at a time, each once the one
// before it is settled and only while a Receive waits (a message taken
// with none waiting would sit locked, and come back with one more
// delivery counted when the session is let go), until the session has
// been idle, with nothing out, for the pool's idle time, is lost, or the
// pool closes.
func (s *session) receive() {
	p := s.p
	defer p.wg.Done()
	defer s.release()
	idleSince := time.Now()
	for {
		p.mu.Lock()
		out, changed, wake, wanted := s.out, s.changed, p.wake, p.waiters > 0
		p.mu.Unlock()
		if out {
			select {
			case <-changed:
				idleSince = time.Now()
			case <-s.ctx.Done():
				return
			}
			continue
		}
		wait := p.idle - time.Since(idleSince)
		if wait <= 0 {
			return // idle: let another process, or another session, have it
		}
		if !wanted {
			t := time.NewTimer(wait)
			select {
			case <-wake:
			case <-changed:
			case <-t.C:
			case <-s.ctx.Done():
			}
			t.Stop()
			if s.ctx.Err() != nil {
				return
			}
			continue
		}
		ctx, cancel := context.WithTimeout(s.ctx, wait)
		msgs, err := s.sr.ReceiveMessages(ctx, 1, nil)
		cancel()
		if len(msgs) > 0 {
			p.deliver(s, msgs[0], time.Now())
			continue
		}
		if s.ctx.Err() != nil || (err != nil && !errors.Is(err, context.DeadlineExceeded)) {
			// Closing, or the session is lost (its lock expired, its link
			// or connection failed): what it held goes back to the
			// session, for the next owner in order.
			return
		}
	}
}

// deliver hands m to the next Receive. Its lease is what is left of the
// session lock, which every message of the session shares.
func (p *sessionPool) deliver(s *session, m *azservicebus.ReceivedMessage, at time.Time) {
	lease := p.lease()
	p.mu.Lock()
	defer p.mu.Unlock()
	if left := s.lockedUntil.Sub(at); left > 0 && (lease <= 0 || left < lease) {
		lease = left
	}
	d := fromSB(m, lease, p.entity)
	d.Received = at
	d.Handle = &sessionMessage{s: s, m: m}
	d.Message.GroupKey = s.id
	s.out = true
	s.touch()
	p.ready = append(p.ready, d)
	p.signal()
}

// keep renews the session lock while nothing of the session is out,
// half a lock duration before it expires; while a delivery is out, its
// extensions renew the lock (Subscription.Extend), so that a delivery the
// Consumer stops extending lets the session go as the Consumer expects.
func (s *session) keep() {
	p := s.p
	defer p.wg.Done()
	for {
		p.mu.Lock()
		out, until, changed := s.out, s.lockedUntil, s.changed
		p.mu.Unlock()
		var due <-chan time.Time
		var t *time.Timer
		if !out {
			t = time.NewTimer(time.Until(until) - p.lease()/2)
			due = t.C
		}
		var err error
		select {
		case <-s.ctx.Done():
		case <-changed:
		case <-due:
			err = s.renew(s.ctx)
		}
		if t != nil {
			t.Stop()
		}
		if s.ctx.Err() != nil || err != nil {
			// A renewal that failed leaves the lock in doubt: let the
			// session go rather than hand out a message under it.
			s.cancel()
			return
		}
	}
}

// renew renews the session lock and records its new expiry.
func (s *session) renew(ctx context.Context) error {
	if err := s.sr.RenewSessionLock(ctx, nil); err != nil {
		return err
	}
	s.p.mu.Lock()
	s.lockedUntil = s.sr.LockedUntil()
	s.touch()
	s.p.mu.Unlock()
	return nil
}

// settled records that h's delivery was settled, with err: the session's
// next message may come. A failed settlement leaves the message's state
// unknown, so the session is let go: Service Bus gives every unsettled
// message of it back, in order, to whoever takes the session next.
func (s *session) settled(err error) {
	if err != nil {
		s.cancel()
	}
	s.p.mu.Lock()
	s.out = false
	s.touch()
	s.p.mu.Unlock()
}

// release closes the session's receiver, which gives the session back
// to Service Bus, and makes room for another.
func (s *session) release() {
	s.cancel()
	p := s.p
	p.mu.Lock()
	delete(p.held, s)
	// A delivery received but not returned yet goes back with the session.
	kept := p.ready[:0]
	for _, d := range p.ready {
		if h, _ := d.Handle.(*sessionMessage); h == nil || h.s != s {
			kept = append(kept, d)
		}
	}
	p.ready = kept
	p.signal()
	p.mu.Unlock()
	p.closeReceiver(s.sr)
}

func (p *sessionPool) closeReceiver(sr sessionReceiver) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = sr.Close(ctx)
}

// isLockLost reports an error that says the session's lock is gone (or
// its link, which held it).
func isLockLost(err error) bool {
	var sbErr *azservicebus.Error
	if errors.As(err, &sbErr) && (sbErr.Code == azservicebus.CodeLockLost || sbErr.Code == azservicebus.CodeClosed) {
		return true
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Condition == "com.microsoft:session-lock-lost" {
		return true
	}
	var le *amqp.LinkError
	return errors.As(err, &le)
}

// close releases every session and waits for their goroutines.
func (p *sessionPool) close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.closed = true
	p.signal()
	p.mu.Unlock()
	p.cancel()
	p.wg.Wait()
	return p.acc.Close(ctx)
}
