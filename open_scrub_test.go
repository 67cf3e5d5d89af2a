// Errors of drivers opened through a URL: talks to nothing outside the
// process (a fake opener over the in-memory broker).
package dedupq_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// errDriver is the driver's own error, which errors.Is must still find
// through whatever the mux makes of it.
var errDriver = errors.New("connection refused")

// quotingOpener is a driver that quotes part of its URL in its errors, as
// SDKs do (the AWS SDK quotes the endpoint, a Service Bus adapter named
// the variable conn_env names): when opening, or when reading the window.
type quotingOpener struct {
	quote func(*url.URL) string
	// atWindow fails Window instead of opening.
	atWindow bool
}

func (o quotingOpener) fail(u *url.URL) error {
	return fmt.Errorf("fake: Post %s: %w", o.quote(u), errDriver)
}

func (o quotingOpener) OpenTopic(_ context.Context, u *url.URL) (driver.Topic, error) {
	if !o.atWindow {
		return nil, o.fail(u)
	}
	return failingWindow{mem.NewBroker(mem.Options{}).Topic("q"), o.fail(u)}, nil
}

func (o quotingOpener) OpenSubscription(_ context.Context, u *url.URL) (driver.Subscription, error) {
	return nil, o.fail(u)
}

type failingWindow struct {
	driver.Topic
	err error
}

func (t failingWindow) Window(context.Context) (window.Window, error) { return window.Window{}, t.err }

// TestDriverErrorsShowNoHiddenPart: whatever part of the URL a driver
// quotes in an error, the mux's errors show none of what RedactURL hides,
// in whatever form the driver quotes it, and still wrap the driver's
// error.
func TestDriverErrorsShowNoHiddenPart(t *testing.T) {
	const secret = "Zq9SeCrEt"
	param := func(k string) func(*url.URL) string { return func(u *url.URL) string { return u.Query().Get(k) } }
	endpoint := func(part func(*url.URL) string) func(*url.URL) string {
		return func(u *url.URL) string {
			e, err := url.Parse(u.Query().Get("endpoint"))
			if err != nil {
				return "unparsable"
			}
			return part(e)
		}
	}
	tests := []struct {
		name  string
		raw   string
		quote func(*url.URL) string
	}{
		{"endpoint", "fake://q?endpoint=http://127.0.0.1:1/" + secret, param("endpoint")},
		{"endpoint path", "fake://q?endpoint=http://127.0.0.1:1/" + secret + "/v1", endpoint(func(e *url.URL) string { return e.Path })},
		{"endpoint host, lowercased", "fake://q?endpoint=http://" + secret + ".example:1/", endpoint(func(e *url.URL) string { return strings.ToLower(e.Host) })},
		{"endpoint re-encoded", "fake://q?endpoint=http://127.0.0.1:1/a!" + secret, endpoint(func(e *url.URL) string { e.RawPath = ""; return e.String() })},
		{"endpoint escaped in the query", "fake://q?endpoint=http%3A%2F%2F127.0.0.1%3A1%2F" + secret, func(u *url.URL) string { return u.RawQuery }},
		{"variable name", "fake://q?conn_env=" + secret, param("conn_env")},
		{"unknown parameter", "fake://q?colour=" + secret, param("colour")},
		{"not UTF-8", "fake://q?colour=%F2" + secret + "%F3%F4", param("colour")},
		{"not UTF-8, quoted", "fake://q?colour=%F2" + secret + "%F3%F4", func(u *url.URL) string { return strconv.Quote(u.Query().Get("colour")) }},
		{"control characters, quoted", "fake://q?colour=%0A" + secret + "%09", func(u *url.URL) string { return strconv.Quote(u.Query().Get("colour")) }},
		{"password", "fake://user:" + secret + "@q", func(u *url.URL) string { p, _ := u.User.Password(); return p }},
		{"token as user", "fake://" + secret + "@q", func(u *url.URL) string { return u.User.Username() }},
		{"fragment", "fake://q#" + secret, func(u *url.URL) string { return u.Fragment }},
		{"path not a name", "fake://q/;key=" + secret, func(u *url.URL) string { return u.Path }},
	}
	ctx := context.Background()
	for _, tt := range tests {
		for _, atWindow := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/atWindow=%v", tt.name, atWindow), func(t *testing.T) {
				m := new(dedupq.URLMux)
				m.Register("fake", quotingOpener{tt.quote, atWindow})
				_, pubErr := m.OpenPublisher(ctx, tt.raw, dedupq.PublisherOptions{})
				_, inErr := m.Inspect(ctx, tt.raw, dedupq.InspectOptions{})
				errs := map[string]error{"OpenPublisher": pubErr, "Inspect": inErr}
				if !atWindow {
					_, errs["OpenConsumer"] = m.OpenConsumer(ctx, tt.raw, dedupq.ConsumerOptions{})
				}
				for what, err := range errs {
					if !errors.Is(err, errDriver) {
						t.Errorf("%s: %v, want it to wrap the driver's error", what, err)
						continue
					}
					for _, text := range []string{err.Error(), fmt.Sprintf("%+v", err)} {
						if strings.Contains(strings.ToLower(text), strings.ToLower(secret)) {
							t.Errorf("%s shows the secret: %s", what, text)
						}
					}
				}
			})
		}
	}
}

// laterOpener opens fine; its topic's sends and its subscription's
// receives then fail quoting the URL's endpoint, as the AWS SDK does for
// every request.
type laterOpener struct{ b *mem.Broker }

func (o laterOpener) quote(u *url.URL) error {
	return fmt.Errorf("fake: Post %q: %w", u.Query().Get("endpoint"), errDriver)
}

func (o laterOpener) OpenTopic(_ context.Context, u *url.URL) (driver.Topic, error) {
	return failingSends{o.b.Topic("q"), o.quote(u)}, nil
}

func (o laterOpener) OpenSubscription(_ context.Context, u *url.URL) (driver.Subscription, error) {
	return failingReceives{o.b.Subscription("q"), o.quote(u)}, nil
}

type failingSends struct {
	driver.Topic
	err error
}

func (t failingSends) SendBatch(context.Context, []*driver.Message) ([]driver.SendResult, error) {
	return nil, t.err
}
func (failingSends) IsRetryable(error) bool { return false }

type failingReceives struct {
	driver.Subscription
	err error
}

func (s failingReceives) Receive(context.Context, int) ([]*driver.Delivery, error) { return nil, s.err }
func (failingReceives) IsRetryable(error) bool                                     { return false }

// The Publisher and the Consumer opened through a URL keep what RedactURL
// hides out of the driver errors they return and log later, not only out
// of the open's: an SDK quotes its endpoint in every request's error.
func TestErrorsAfterOpeningShowNoHiddenPart(t *testing.T) {
	const secret = "Zq9SeCrEt"
	raw := "fake://q?endpoint=http://127.0.0.1:1/" + secret
	ctx := context.Background()
	m := new(dedupq.URLMux)
	m.Register("fake", laterOpener{mem.NewBroker(mem.Options{DedupWindow: 5 * time.Minute})})

	pub, err := m.OpenPublisher(ctx, raw, dedupq.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(ctx)
	_, pubErr := pub.Publish(ctx, &dedupq.Message{ID: "a", Body: []byte("b")})
	_, batchErr := pub.PublishBatch(ctx, []*dedupq.Message{{ID: "b", Body: []byte("b")}})

	var log strings.Builder
	con, err := m.OpenConsumer(ctx, raw, dedupq.ConsumerOptions{Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	runErr := con.Run(ctx, func(context.Context, *dedupq.Delivery) error { return nil })
	if err := con.Close(ctx); err != nil {
		t.Fatal(err)
	}

	for what, err := range map[string]error{"Publish": pubErr, "PublishBatch": batchErr, "Run": runErr} {
		if !errors.Is(err, errDriver) {
			t.Errorf("%s: %v, want it to wrap the driver's error", what, err)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s shows the secret: %v", what, err)
		}
	}
	if !strings.Contains(log.String(), "receive failed for good") || strings.Contains(log.String(), secret) {
		t.Errorf("the consumer's log: %s\nwant its receive error without the secret", log.String())
	}
}
