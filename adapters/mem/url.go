package mem

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

func init() { dedupq.Register("mem", urlOpener{}) }

// urlBrokers holds the process-wide brokers behind mem:// URLs, one per
// queue name, so that a publisher and a consumer opened from URLs naming the
// same queue meet, whichever opens first.
var urlBrokers = struct {
	sync.Mutex
	m map[string]*Broker
}{m: make(map[string]*Broker)}

// URLBroker returns the process-wide broker behind mem://name, or nil when
// no URL has opened that queue yet. Its queue is also called name, so tests
// and demos read URLBroker(name).Stats(name).
//
// A mem URL is mem://NAME?param=value&… with these optional parameters:
//
//	window=2m          Options.DedupWindow (a Go duration; 0 or absent: no dedup)
//	ack_wait=30s       Options.AckWait
//	max_deliveries=5   Options.MaxDeliveries (0: unlimited)
//	backoff=1s,5s      Options.Backoff
//	seed=42            Options.Faults.Seed
//	dup_publish=0.1    Options.Faults.DuplicatePublish (and dup_delivery, lost_ack)
//
// The first URL that names a queue creates its broker, on the real clock,
// with that URL's parameters, once the Publisher's or Consumer's startup
// check passed (a refused open leaves no broker behind); later URLs share
// it. A later URL may leave
// parameters out, but one that states a different value fails with a
// *dedupq.ParamError instead of silently reaching a broker configured
// otherwise. Unknown or malformed parameters fail the same way.
func URLBroker(name string) *Broker {
	urlBrokers.Lock()
	defer urlBrokers.Unlock()
	return urlBrokers.m[name]
}

// urlParam is one URL parameter: how to read it into Options and how to
// show an Options' value for comparison with another URL's.
type urlParam struct {
	set func(o *Options, v string) error
	get func(o Options) string
}

func durationParam(field func(*Options) *time.Duration) urlParam {
	return urlParam{
		set: func(o *Options, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return fmt.Errorf("want a non-negative Go duration such as 30s or 2m")
			}
			*field(o) = d
			return nil
		},
		get: func(o Options) string { return field(&o).String() },
	}
}

func probParam(field func(*Options) *float64) urlParam {
	return urlParam{
		set: func(o *Options, v string) error {
			p, err := strconv.ParseFloat(v, 64)
			if err != nil || !(p >= 0 && p <= 1) {
				return fmt.Errorf("want a probability between 0 and 1")
			}
			*field(o) = p
			return nil
		},
		get: func(o Options) string { return strconv.FormatFloat(*field(&o), 'g', -1, 64) },
	}
}

var urlParams = map[string]urlParam{
	"window":   durationParam(func(o *Options) *time.Duration { return &o.DedupWindow }),
	"ack_wait": durationParam(func(o *Options) *time.Duration { return &o.AckWait }),
	"max_deliveries": {
		set: func(o *Options, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return fmt.Errorf("want a non-negative integer")
			}
			o.MaxDeliveries = n
			return nil
		},
		get: func(o Options) string { return strconv.Itoa(o.MaxDeliveries) },
	},
	"backoff": {
		set: func(o *Options, v string) error {
			o.Backoff = nil
			for _, s := range strings.Split(v, ",") {
				d, err := time.ParseDuration(strings.TrimSpace(s))
				if err != nil || d < 0 {
					return fmt.Errorf("want a comma-separated list of Go durations such as 1s,5s")
				}
				o.Backoff = append(o.Backoff, d)
			}
			return nil
		},
		get: func(o Options) string { return fmt.Sprint(o.Backoff) },
	},
	"seed": {
		set: func(o *Options, v string) error {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return fmt.Errorf("want an unsigned integer")
			}
			o.Faults.Seed = n
			return nil
		},
		get: func(o Options) string { return strconv.FormatUint(o.Faults.Seed, 10) },
	},
	"dup_publish":  probParam(func(o *Options) *float64 { return &o.Faults.DuplicatePublish }),
	"dup_delivery": probParam(func(o *Options) *float64 { return &o.Faults.DuplicateDelivery }),
	"lost_ack":     probParam(func(o *Options) *float64 { return &o.Faults.LostAck }),
}

var queueNameRE = regexp.MustCompile(`^[A-Za-z0-9._~-]{1,255}$`)

// urlQueue is a queue as a mem:// URL names it.
type urlQueue struct {
	u    *url.URL // the URL, for errors (dedupq.NewParamError redacts it)
	name string   // the queue name
	opts Options  // as the URL states them
	keys []string // the parameters the URL states, sorted
}

// parseURL reads u without touching the registry of URL brokers.
func parseURL(u *url.URL) (urlQueue, error) {
	// No reason quotes a value from the URL: see dedupq.ParamError.
	bad := func(param, format string, args ...any) error {
		return dedupq.NewParamError(u, param, fmt.Sprintf(format, args...))
	}
	name := u.Host
	if name == "" {
		return urlQueue{}, bad("name", "missing queue name: use mem://NAME")
	}
	if !queueNameRE.MatchString(name) {
		// The name shows in windows and errors: only a name.
		return urlQueue{}, bad("name", "not a queue name (up to 255 letters, digits, '.', '_', '~', '-')")
	}
	if u.Path != "" && u.Path != "/" {
		return urlQueue{}, bad("name", "unexpected path: the queue is named by the host, mem://NAME")
	}
	q, err := dedupq.QueryParams(u, slices.Sorted(maps.Keys(urlParams)), "an in-memory broker has none")
	if err != nil {
		return urlQueue{}, err
	}
	keys := slices.Sorted(maps.Keys(q))
	var opts Options
	for _, k := range keys {
		if err := urlParams[k].set(&opts, q[k][0]); err != nil {
			return urlQueue{}, bad(k, "%v", err)
		}
	}
	return urlQueue{u: u, name: name, opts: opts, keys: keys}, nil
}

// fits refuses a registered broker whose options differ from a parameter
// the URL states.
func (uq urlQueue) fits(b *Broker) error {
	want := NewBroker(uq.opts).opts // the same defaults, for comparison
	for _, k := range uq.keys {
		if got, asked := urlParams[k].get(b.opts), urlParams[k].get(want); got != asked {
			return dedupq.NewParamError(uq.u, k,
				fmt.Sprintf("the queue is already open in this process with %s=%s, not %s", k, got, asked))
		}
	}
	return nil
}

// lookup returns the registered broker of the queue, checked against the
// URL, or, when no URL has opened the queue yet, a new broker with the
// URL's options that is not registered: register does that, once the
// startup check passed, so that a refused open leaves no broker behind to
// fix the queue's options for the next open.
func (uq urlQueue) lookup() (b *Broker, registered bool, err error) {
	urlBrokers.Lock()
	defer urlBrokers.Unlock()
	if b := urlBrokers.m[uq.name]; b != nil {
		return b, true, uq.fits(b)
	}
	return NewBroker(uq.opts), false, nil
}

// register makes b the queue's process-wide broker, or returns the one
// another open registered meanwhile, checked against the URL.
func (uq urlQueue) register(b *Broker) (*Broker, error) {
	urlBrokers.Lock()
	defer urlBrokers.Unlock()
	if got := urlBrokers.m[uq.name]; got != nil {
		return got, uq.fits(got)
	}
	urlBrokers.m[uq.name] = b
	return b, nil
}

// urlHandle is the part of a URL-opened topic or subscription that
// provisions: it holds a handle on the queue's broker, which is a pending
// one until Provision registers it (see driver.Provisioner).
type urlHandle[H interface{ Close() error }] struct {
	uq   urlQueue
	open func(b *Broker) H

	provision sync.Mutex
	mu        sync.Mutex
	h         H
	broker    *Broker
	done      bool // registered
}

func newURLHandle[H interface{ Close() error }](u *url.URL, open func(b *Broker) H) (*urlHandle[H], error) {
	uq, err := parseURL(u)
	if err != nil {
		return nil, err
	}
	b, registered, err := uq.lookup()
	if err != nil {
		return nil, err
	}
	return &urlHandle[H]{uq: uq, open: open, h: open(b), broker: b, done: registered}, nil
}

func (u *urlHandle[H]) cur() H {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.h
}

// Provision registers the pending broker as the queue's process-wide one,
// or, when another open registered one meanwhile, switches to that one if
// it fits the URL.
func (u *urlHandle[H]) Provision(context.Context) error {
	u.provision.Lock()
	defer u.provision.Unlock()
	u.mu.Lock()
	done, pending := u.done, u.broker
	u.mu.Unlock()
	if done {
		return nil
	}
	b, err := u.uq.register(pending)
	if err != nil {
		return err
	}
	u.mu.Lock()
	old := u.h
	if b != pending {
		u.h, u.broker = u.open(b), b
	}
	u.done = true
	u.mu.Unlock()
	if b != pending {
		return old.Close()
	}
	return nil
}

// ready provisions a handle used without the portable layer.
func (u *urlHandle[H]) ready(ctx context.Context) (H, error) {
	if err := u.Provision(ctx); err != nil {
		var zero H
		return zero, err
	}
	return u.cur(), nil
}

func (u *urlHandle[H]) Close() error { return u.cur().Close() }

// urlTopic is a topic opened from a mem:// URL.
type urlTopic struct{ *urlHandle[driver.Topic] }

var (
	_ driver.Topic       = urlTopic{}
	_ driver.Provisioner = urlTopic{}
)

func (t urlTopic) SendBatch(ctx context.Context, msgs []*driver.Message) ([]driver.SendResult, error) {
	h, err := t.ready(ctx)
	if err != nil {
		return nil, err
	}
	return h.SendBatch(ctx, msgs)
}
func (t urlTopic) MaxBatch() int                  { return t.cur().MaxBatch() }
func (t urlTopic) Limits() driver.Limits          { return t.cur().Limits() }
func (t urlTopic) HiddenRetrySpan() time.Duration { return t.cur().HiddenRetrySpan() }
func (t urlTopic) IsRetryable(err error) bool     { return t.cur().IsRetryable(err) }
func (t urlTopic) Window(ctx context.Context) (window.Window, error) {
	return t.cur().Window(ctx)
}

// urlSubscription is a subscription opened from a mem:// URL.
type urlSubscription struct {
	*urlHandle[driver.Subscription]
}

var (
	_ driver.Subscription = urlSubscription{}
	_ driver.Provisioner  = urlSubscription{}
	_ driver.GroupOrderer = urlSubscription{}
)

// OrdersGroups reports nil, as the broker's own subscription does: a
// wrapper that did not say so would make an ordered Consumer refuse mem://.
func (urlSubscription) OrdersGroups(context.Context) error { return nil }

func (s urlSubscription) Receive(ctx context.Context, n int) ([]*driver.Delivery, error) {
	h, err := s.ready(ctx)
	if err != nil {
		return nil, err
	}
	return h.Receive(ctx, n)
}
func (s urlSubscription) Ack(ctx context.Context, d *driver.Delivery) error {
	return s.cur().Ack(ctx, d)
}
func (s urlSubscription) Nack(ctx context.Context, d *driver.Delivery, delay time.Duration) error {
	return s.cur().Nack(ctx, d, delay)
}
func (s urlSubscription) Terminate(ctx context.Context, d *driver.Delivery, reason error) error {
	return s.cur().Terminate(ctx, d, reason)
}
func (s urlSubscription) Extend(ctx context.Context, d *driver.Delivery, by time.Duration) error {
	return s.cur().Extend(ctx, d, by)
}
func (s urlSubscription) Window(ctx context.Context) (window.Window, error) {
	return s.cur().Window(ctx)
}
func (s urlSubscription) Redelivery(ctx context.Context) (window.RedeliveryPolicy, error) {
	return s.cur().Redelivery(ctx)
}
func (s urlSubscription) IsRetryable(err error) bool { return s.cur().IsRetryable(err) }

// urlOpener opens mem:// URLs for dedupq.OpenPublisher and
// dedupq.OpenConsumer. What it opens implements driver.Provisioner: the
// first URL that names a queue registers its broker only when the startup
// check passed.
type urlOpener struct{}

func (urlOpener) OpenTopic(_ context.Context, u *url.URL) (driver.Topic, error) {
	h, err := newURLHandle(u, func(b *Broker) driver.Topic { return b.Topic(u.Host) })
	if err != nil {
		return nil, err
	}
	return urlTopic{h}, nil
}

func (urlOpener) OpenSubscription(_ context.Context, u *url.URL) (driver.Subscription, error) {
	h, err := newURLHandle(u, func(b *Broker) driver.Subscription { return b.Subscription(u.Host) })
	if err != nil {
		return nil, err
	}
	return urlSubscription{h}, nil
}
