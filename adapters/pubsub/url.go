package pubsub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	"google.golang.org/api/option"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/driver"
)

// Scheme is the URL scheme the package registers.
const Scheme = "pubsub"

func init() { dedupq.Register(Scheme, &URLOpener{}) }

// URLOpener opens pubsub:// URLs; the package registers one with the
// default mux. The host is the project and the path one resource ID:
//
//	pubsub://my-project/orders          publishers: topic "orders"; consumers: subscription "orders"
//
// Parameters (all optional):
//
//	emulator          host:port of a Pub/Sub emulator (no TLS, no credentials); without it
//	                  the client honours PUBSUB_EMULATOR_HOST, else the real service with the
//	                  standard Google credentials chain
//	publish_timeout   Options.PublishTimeout, a Go duration ("30s")
//	ack_wait          Options.AckExtension, a Go duration from 10s to 600s
//	max_extension     Options.MaxExtension ("1h")
//	max_outstanding   Options.MaxOutstandingMessages, a positive integer
//
// A URL never carries credentials. A missing or malformed part is reported
// as a *dedupq.ParamError. Each opened driver has its own client (made by
// NewClient) and closes it.
type URLOpener struct {
	// ClientOptions are passed to NewClient after the opener's own.
	ClientOptions []option.ClientOption
}

// OpenTopic opens a Topic for the topic the URL names.
func (o *URLOpener) OpenTopic(ctx context.Context, u *url.URL) (driver.Topic, error) {
	c, id, opts, err := o.open(ctx, u)
	if err != nil {
		return nil, err
	}
	t, err := openTopic(ctx, c, true, id, opts)
	if err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return t, nil
}

// OpenSubscription opens a Subscription for the subscription the URL names.
func (o *URLOpener) OpenSubscription(ctx context.Context, u *url.URL) (driver.Subscription, error) {
	c, id, opts, err := o.open(ctx, u)
	if err != nil {
		return nil, err
	}
	s, err := openSubscription(ctx, c, true, id, opts)
	if err != nil {
		return nil, errors.Join(err, c.Close())
	}
	return s, nil
}

func (o *URLOpener) open(ctx context.Context, u *url.URL) (*gpubsub.Client, string, *Options, error) {
	cfg, err := ParseURL(u)
	if err != nil {
		return nil, "", nil, err
	}
	c, err := NewClient(ctx, cfg.Project, cfg.Emulator, o.ClientOptions...)
	if err != nil {
		return nil, "", nil, err
	}
	return c, cfg.ID, &cfg.Options, nil
}

// URLConfig is what a pubsub:// URL says.
type URLConfig struct {
	// Project is the Google Cloud project.
	Project string
	// ID is the topic ID (for publishers) or subscription ID (for
	// consumers).
	ID string
	// Emulator is the emulator's host:port; empty means none named.
	Emulator string
	// Options are the driver options the parameters set.
	Options Options
}

var (
	// Project IDs are 6–30 characters; emulators take shorter ones, so only
	// the alphabet is checked.
	projectRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)
	// Topic and subscription IDs: 3–255 characters, starting with a
	// letter, not with "goog".
	resourceRE  = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9._~+%-]{2,254}$`)
	knownParams = []string{"emulator", "publish_timeout", "ack_wait", "max_extension", "max_outstanding"}
	emuHostRE   = regexp.MustCompile(`^[A-Za-z0-9.-]+$|^[0-9A-Fa-f:.]+$`)
	portRE      = regexp.MustCompile(`^[0-9]{1,5}$`)

	credentialHint = "they come from the standard Google chain (GOOGLE_APPLICATION_CREDENTIALS, gcloud, metadata server)"
)

// ParseURL reads a pubsub:// URL without contacting anything.
func ParseURL(u *url.URL) (URLConfig, error) {
	// No reason quotes a value from the URL: see dedupq.ParamError.
	bad := func(param, format string, args ...any) error {
		return dedupq.NewParamError(u, param, fmt.Sprintf(format, args...))
	}
	var cfg URLConfig
	if u.Scheme != Scheme {
		return cfg, bad("scheme", "want %s://", Scheme)
	}
	if u.User != nil {
		return cfg, bad("credentials", "a pubsub URL never carries credentials: %s", credentialHint)
	}
	if u.Port() != "" {
		return cfg, bad("project", "the host is the project, not a server: give an emulator's address as ?emulator=HOST:PORT")
	}
	cfg.Project = u.Hostname()
	if !projectRE.MatchString(cfg.Project) {
		return cfg, bad("project", "the host is not a project ID (lowercase letters, digits and hyphens): use pubsub://PROJECT/ID")
	}
	cfg.ID = strings.TrimPrefix(u.Path, "/")
	switch {
	case cfg.ID == "":
		return cfg, bad("id", "missing topic or subscription ID: use pubsub://PROJECT/ID")
	case strings.Contains(cfg.ID, "/"):
		return cfg, bad("id", "the path is one topic or subscription ID, without slashes")
	case !resourceRE.MatchString(cfg.ID) || strings.HasPrefix(cfg.ID, "goog"):
		return cfg, bad("id", "the path is not a Pub/Sub ID (3–255 characters: letters, digits, . _ ~ + %% -, starting with a letter, not with goog)")
	}
	q, err := dedupq.QueryParams(u, knownParams, credentialHint)
	if err != nil {
		return cfg, err
	}
	if q.Has("emulator") {
		// Only an address: the client quotes it in its errors.
		e := q.Get("emulator")
		if host, port, err := net.SplitHostPort(e); err != nil || !emuHostRE.MatchString(host) || !portRE.MatchString(port) {
			return cfg, bad("emulator", "want HOST:PORT, such as 127.0.0.1:8085")
		}
		cfg.Emulator = e
	}
	durations := []struct {
		name     string
		dst      *time.Duration
		min, max time.Duration
	}{
		{"publish_timeout", &cfg.Options.PublishTimeout, time.Millisecond, 24 * time.Hour},
		{"ack_wait", &cfg.Options.AckExtension, minAckExtension, maxAckExtension},
		{"max_extension", &cfg.Options.MaxExtension, time.Second, 7 * 24 * time.Hour},
	}
	for _, d := range durations {
		if !q.Has(d.name) {
			continue
		}
		v, err := time.ParseDuration(q.Get(d.name))
		if err != nil || v < d.min || v > d.max {
			return cfg, bad(d.name, "want a duration between %s and %s", d.min, d.max)
		}
		*d.dst = v
	}
	if q.Has("max_outstanding") {
		n, err := strconv.Atoi(q.Get("max_outstanding"))
		if err != nil || n <= 0 {
			return cfg, bad("max_outstanding", "want a positive integer")
		}
		cfg.Options.MaxOutstandingMessages = n
	}
	return cfg, nil
}
