package dedupq

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/dedupq/dedupq/driver"
)

// ErrUnknownScheme is returned for a URL whose scheme no linked-in backend
// registered.
var ErrUnknownScheme = errors.New("dedupq: unknown URL scheme")

// URLOpener opens a backend's driver from a URL. Each adapter package
// registers one for its scheme when it is imported, the way database/sql
// drivers do.
type URLOpener interface {
	OpenTopic(ctx context.Context, u *url.URL) (driver.Topic, error)
	OpenSubscription(ctx context.Context, u *url.URL) (driver.Subscription, error)
}

// URLMux maps URL schemes to openers. The zero value is an empty mux; most
// programs use the default one through Register, OpenPublisher and
// OpenConsumer, and only tests need their own.
type URLMux struct {
	mu      sync.RWMutex
	openers map[string]URLOpener
}

var defaultMux = new(URLMux)

// DefaultURLMux is the mux that Register, OpenPublisher and OpenConsumer
// use.
func DefaultURLMux() *URLMux { return defaultMux }

// Register makes a backend available under scheme in the default mux. It
// panics if the scheme is registered twice, as database/sql.Register does.
func Register(scheme string, o URLOpener) { defaultMux.Register(scheme, o) }

// Register makes o open URLs with scheme.
func (m *URLMux) Register(scheme string, o URLOpener) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.openers == nil {
		m.openers = make(map[string]URLOpener)
	}
	if _, dup := m.openers[scheme]; dup {
		panic("dedupq: Register called twice for scheme " + scheme)
	}
	m.openers[scheme] = o
}

// Schemes lists the registered schemes, sorted.
func (m *URLMux) Schemes() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var s []string
	for k := range m.openers {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}

func (m *URLMux) opener(raw string) (URLOpener, *url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("dedupq: malformed URL: %w", err)
	}
	if u.Scheme == "" {
		return nil, nil, fmt.Errorf("dedupq: URL %q has no scheme (want one of %s)", raw, strings.Join(m.Schemes(), ", "))
	}
	m.mu.RLock()
	o := m.openers[u.Scheme]
	m.mu.RUnlock()
	if o == nil {
		return nil, nil, fmt.Errorf("%w %q (registered: %s; import the adapter package to register it)",
			ErrUnknownScheme, u.Scheme, strings.Join(m.Schemes(), ", "))
	}
	return o, u, nil
}

// OpenPublisher opens the backend named by rawURL and wraps it in a
// Publisher, running the same startup check as NewPublisher.
func (m *URLMux) OpenPublisher(ctx context.Context, rawURL string, opts PublisherOptions) (*Publisher, error) {
	o, u, err := m.opener(rawURL)
	if err != nil {
		return nil, err
	}
	t, err := o.OpenTopic(ctx, u)
	if err != nil {
		return nil, err
	}
	p, err := NewPublisher(ctx, t, opts)
	if err != nil {
		return nil, errors.Join(err, t.Close())
	}
	return p, nil
}

// OpenConsumer opens the backend named by rawURL and wraps it in a
// Consumer, running the same startup check as NewConsumer.
func (m *URLMux) OpenConsumer(ctx context.Context, rawURL string, opts ConsumerOptions) (*Consumer, error) {
	o, u, err := m.opener(rawURL)
	if err != nil {
		return nil, err
	}
	s, err := o.OpenSubscription(ctx, u)
	if err != nil {
		return nil, err
	}
	c, err := NewConsumer(ctx, s, opts)
	if err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return c, nil
}

// OpenPublisher opens a Publisher from a URL such as "mem://orders" or
// "jetstream://127.0.0.1:4222/ORDERS?subject=orders", using the default mux.
// The backend's package must be imported (for its registration) somewhere
// in the program.
func OpenPublisher(ctx context.Context, rawURL string, opts PublisherOptions) (*Publisher, error) {
	return defaultMux.OpenPublisher(ctx, rawURL, opts)
}

// OpenConsumer opens a Consumer from a URL, using the default mux.
func OpenConsumer(ctx context.Context, rawURL string, opts ConsumerOptions) (*Consumer, error) {
	return defaultMux.OpenConsumer(ctx, rawURL, opts)
}

// ParamError reports a missing or malformed URL parameter. Adapters return
// it from their openers so that every backend names the parameter the same
// way.
type ParamError struct {
	URL    string
	Param  string
	Reason string
}

// Error implements the error interface.
func (e *ParamError) Error() string {
	return fmt.Sprintf("dedupq: URL %q: parameter %q: %s", e.URL, e.Param, e.Reason)
}
