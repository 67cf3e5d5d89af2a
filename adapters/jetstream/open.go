package jetstream

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/jetstream/internal/inprocess"
	"github.com/dedupq/dedupq/driver"
)

func init() { dedupq.Register(Scheme, URLOpener{}) }

// URLOpener opens jetstream:// URLs; the package registers it under Scheme.
// Each Topic and Subscription it opens dials its own connection, closed
// with it. The host EmbeddedHost names the server package embedded runs in
// the process (see the package doc).
type URLOpener struct {
	// Options are added to the connection options the opener uses (TLS,
	// credentials, …). ReconnectBufSize is forced to -1 whatever they say
	// (see OpenTopic).
	Options []nats.Option
}

// OpenTopic parses u, dials the server and opens a Topic.
func (o URLOpener) OpenTopic(ctx context.Context, u *url.URL) (driver.Topic, error) {
	server, cfg, err := ParseURL(u)
	if err != nil {
		return nil, err
	}
	nc, release, err := o.dial(ctx, server, u)
	if err != nil {
		return nil, err
	}
	t, err := newTopic(ctx, nc, cfg, true)
	if err != nil {
		nc.Close()
		release()
		return nil, err
	}
	t.release = release
	return t, nil
}

// OpenSubscription parses u, which must name a durable, dials the server
// and opens a Subscription.
func (o URLOpener) OpenSubscription(ctx context.Context, u *url.URL) (driver.Subscription, error) {
	server, cfg, err := ParseURL(u)
	if err != nil {
		return nil, err
	}
	if cfg.Durable == "" {
		return nil, dedupq.NewParamError(u, "durable", "missing: consuming needs a durable consumer name, as in &durable=billing")
	}
	nc, release, err := o.dial(ctx, server, u)
	if err != nil {
		return nil, err
	}
	s, err := newSubscription(ctx, nc, cfg, true)
	if err != nil {
		nc.Close()
		release()
		return nil, err
	}
	s.release = release
	return s, nil
}

// EmbeddedHost is the URL host that names the NATS server package
// embedded runs inside the process, as in
// jetstream://embedded/ORDERS?subject=orders. Without that package linked
// in, opening such a URL fails with a *dedupq.ParamError saying to import
// it.
const EmbeddedHost = inprocess.Host

// dial connects with the options every dedupq connection needs: no
// reconnect buffer (see OpenTopic), reconnecting forever (a publish during
// a reconnect fails at once and is retried by the Publisher), and a
// connect timeout within ctx. release is to be called once the connection
// is closed: it lets the in-process server stop when nothing uses it.
func (o URLOpener) dial(ctx context.Context, server string, u *url.URL) (nc *nats.Conn, release func(), err error) {
	timeout := 5 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, max(time.Until(dl), time.Millisecond))
	}
	opts := append([]nats.Option{
		nats.Name("dedupq"),
		nats.Timeout(timeout),
		nats.MaxReconnects(-1),
	}, o.Options...)
	opts = append(opts, nats.ReconnectBufSize(-1))
	release = func() {}
	if strings.EqualFold(u.Hostname(), EmbeddedHost) {
		local, err := embeddedServer(u)
		if err != nil {
			return nil, nil, err
		}
		connect, rel, err := local.Acquire(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("jetstream: starting the in-process server for %s: %w", dedupq.RedactURL(u), err)
		}
		opts, release = append(opts, connect), rel
	}
	nc, err = nats.Connect(server, opts...)
	if err != nil {
		release()
		// u.Redacted() would show a token given as the user name.
		return nil, nil, fmt.Errorf("jetstream: connecting to %s: %w", dedupq.RedactURL(u), withoutUserinfo(err, u.User))
	}
	return nc, release, nil
}

// embeddedServer returns the in-process server a URL with the host
// EmbeddedHost names. Without package embedded it fails with a
// *dedupq.ParamError instead of letting the client look the name up in DNS.
func embeddedServer(u *url.URL) (inprocess.Server, error) {
	if u.Port() != "" {
		return nil, dedupq.NewParamError(u, "host", fmt.Sprintf("the in-process server %q has no port: write %s://%s/STREAM?…", EmbeddedHost, Scheme, EmbeddedHost))
	}
	s := inprocess.Registered()
	if s == nil {
		return nil, dedupq.NewParamError(u, "host", fmt.Sprintf("%q names the NATS server run inside the process by package github.com/dedupq/dedupq/adapters/jetstream/embedded, which this program does not link in: add import _ \"github.com/dedupq/dedupq/adapters/jetstream/embedded\"", EmbeddedHost))
	}
	return s, nil
}

// withoutUserinfo returns err, or an error with its text and without the
// user-info's name and password when the text shows either (the client
// returns some url.Parse errors as they are, quoting the server URL).
func withoutUserinfo(err error, user *url.Userinfo) error {
	if user == nil {
		return err
	}
	msg := err.Error()
	pw, _ := user.Password()
	for _, s := range []string{user.Username(), pw, url.PathEscape(user.Username()), url.PathEscape(pw)} {
		if s != "" && strings.Contains(msg, s) {
			msg = strings.ReplaceAll(msg, s, dedupq.Redacted)
			err = nil
		}
	}
	if err == nil {
		return errors.New(msg)
	}
	return err
}
