package servicebus

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/driver"
)

// Scheme is the URL scheme the package registers.
const Scheme = "servicebus"

// DefaultConnEnv is the environment variable that holds the connection
// string when a URL names none with conn_env.
const DefaultConnEnv = "SERVICEBUS_CONNECTION_STRING"

func init() { dedupq.Register(Scheme, &URLOpener{}) }

// URLOpener opens servicebus:// URLs; the package registers one with the
// default mux. The host is the namespace (as in the connection string's
// Endpoint, port allowed), the path the entity:
//
//	servicebus://myns.servicebus.windows.net/orders                         queue orders
//	servicebus://myns.servicebus.windows.net/events?kind=topic              topic events (publishing)
//	servicebus://myns.servicebus.windows.net/events/subscriptions/billing   its subscription billing
//
// The connection string comes from an environment variable, never from the
// URL: DefaultConnEnv, or the one conn_env names. Its Endpoint host must be
// the URL's host, so that a URL cannot silently reach another namespace.
// Connection strings with UseDevelopmentEmulator=true (the official
// emulator, or the test double) work as they are.
//
// Parameters (all optional):
//
//	window              state the entity's properties instead of reading them
//	                    (Options.Stated): the duplicate detection window ("10m"),
//	                    or "none" for an entity without duplicate detection
//	ack_wait            with window: the LockDuration (default 1m, Service Bus's default)
//	max_deliveries      with window: the MaxDeliveryCount (default 10, Service Bus's default)
//	max_batch           Options.MaxBatch
//	conn_env            name of the environment variable holding the connection string
//	kind                queue (default) or topic; a path with /subscriptions/ is a topic
//	max_message_bytes   with window: the message size limit (default 256 KiB, Standard tier)
//	sessions            with window: the entity requires sessions (RequiresSession), true or false
//	                    (default false); with create: create it with sessions
//	session_idle        Options.SessionIdle: how long a consumer keeps a session with nothing to
//	                    do before it lets it go (default 1s), on a session entity
//	create              Options.Create: true creates the queue, or the topic and the subscription,
//	                    if missing, once the startup checks pass, with the properties window,
//	                    ack_wait, max_deliveries, max_message_bytes and sessions give (which
//	                    then describe what to create; duplicate detection over 10m unless
//	                    window says otherwise); the properties are read, never stated
//
// window, ack_wait, max_deliveries, max_batch and create have the same
// names on every backend that takes them (see the README's parameter
// table).
//
// Without window the properties are read through the management API
// (Manage rights needed), as they are with create. The SDK's management
// client always speaks HTTPS to the namespace, which the emulator does not
// serve, so an emulator connection string needs window, and cannot
// create. A session entity is consumed through the sessions it accepts
// (see OpenSessionSubscription): a URL names the entity only. A missing or
// malformed parameter is reported as a *dedupq.ParamError.
type URLOpener struct {
	// ClientOptions are passed to the SDK client. Nil means
	// ClientOptions(); options given here are used as they are.
	ClientOptions *azservicebus.ClientOptions
}

// URLConfig is what ParseURL reads from a servicebus:// URL.
type URLConfig struct {
	// Namespace is the URL's host (with port, if any).
	Namespace string
	// Entity is the queue, topic or subscription.
	Entity Entity
	// ConnEnv names the environment variable holding the connection
	// string.
	ConnEnv string
	// Options are the options the parameters set (Stated, MaxBatch).
	Options Options
}

var (
	// entityNameRE is Service Bus's rule for queue and topic names
	// (letters, digits, periods, hyphens, underscores and slashes, up to
	// 260 characters, starting and ending with a letter or digit); a
	// subscription name has no slashes and at most 50 characters.
	entityNameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,258}[A-Za-z0-9])?$`)
	subNameRE    = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,48}[A-Za-z0-9])?$`)
	envNameRE    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	hostRE       = regexp.MustCompile(`^[A-Za-z0-9.-]+(:[0-9]+)?$|^\[[0-9A-Fa-f:.]+\](:[0-9]+)?$`)
	knownParams  = []string{"window", "ack_wait", "max_deliveries", "max_batch", "conn_env", "kind", "max_message_bytes", "sessions", "session_idle", "create"}
)

const credentialHint = "put the connection string in an environment variable and name it with conn_env"

// ParseURL reads a servicebus:// URL. It does not touch the network or the
// environment.
func ParseURL(u *url.URL) (URLConfig, error) {
	// No reason quotes a value from the URL: see dedupq.ParamError.
	perr := func(param, format string, args ...any) error {
		return dedupq.NewParamError(u, param, fmt.Sprintf(format, args...))
	}
	var c URLConfig
	if u.Scheme != Scheme {
		return c, perr("scheme", "want %s://", Scheme)
	}
	if u.User != nil {
		return c, perr("userinfo", "credentials never go in a URL: %s", credentialHint)
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" || !hostRE.MatchString(u.Host) {
		return c, perr("host", "want the namespace host, as in servicebus://myns.servicebus.windows.net/queue")
	}
	c.Namespace = u.Host
	q, err := dedupq.QueryParams(u, knownParams, credentialHint)
	if err != nil {
		return c, err
	}
	path := strings.TrimPrefix(u.Path, "/")
	if path == "" {
		return c, perr("path", "want the entity: /queue, /topic?kind=topic or /topic/subscriptions/name")
	}
	kind := q.Get("kind")
	if topic, sub, ok := strings.Cut(path, "/subscriptions/"); ok {
		if kind == "queue" {
			return c, perr("kind", "a path with /subscriptions/ names a topic subscription, not a queue")
		}
		if !entityNameRE.MatchString(topic) || strings.Contains(topic, "//") {
			return c, perr("path", "the topic name is not a valid Service Bus entity name")
		}
		if !subNameRE.MatchString(sub) {
			return c, perr("path", "the subscription name is not valid (letters, digits, '.', '-', '_', at most 50)")
		}
		c.Entity = Entity{Topic: topic, Subscription: sub}
	} else {
		if !entityNameRE.MatchString(path) || strings.Contains(path, "//") {
			return c, perr("path", "the entity name is not a valid Service Bus entity name (letters, digits, '.', '-', '_', '/', at most 260)")
		}
		switch kind {
		case "", "queue":
			c.Entity = Entity{Queue: path}
		case "topic":
			c.Entity = Entity{Topic: path}
		default:
			return c, perr("kind", "want queue or topic")
		}
	}
	c.ConnEnv = DefaultConnEnv
	if v, ok := q["conn_env"]; ok {
		if !envNameRE.MatchString(v[0]) {
			return c, perr("conn_env", "not an environment variable name (letters, digits, '_')")
		}
		c.ConnEnv = v[0]
	}
	if v := q.Get("max_batch"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 4500 {
			return c, perr("max_batch", "want a number from 1 to 4500")
		}
		c.Options.MaxBatch = n
	}
	if v := q.Get("session_idle"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 100*time.Millisecond || d > 10*time.Minute {
			return c, perr("session_idle", "want a duration from 100ms to 10m")
		}
		c.Options.SessionIdle = d
	}
	create := false
	if q.Has("create") {
		b, err := strconv.ParseBool(q.Get("create"))
		if err != nil {
			return c, perr("create", "want true or false")
		}
		create = b
	}
	w, hasWindow := q["window"]
	if !hasWindow && !create {
		for _, k := range []string{"ack_wait", "max_deliveries", "max_message_bytes", "sessions"} {
			if q.Has(k) {
				return c, perr(k, "only meaningful with window, which states the entity's properties instead of reading them, or with create=true, which creates the entity with them")
			}
		}
		return c, nil
	}
	st := EntityProperties{LockDuration: time.Minute, MaxDeliveryCount: 10, MaxMessageBytes: DefaultMaxMessageBytes}
	if !hasWindow {
		// What create=true makes without window: duplicate detection over
		// Service Bus's default history window, which dedupq's publisher
		// retries need.
		w = []string{"10m"}
	}
	if q.Has("sessions") {
		b, err := strconv.ParseBool(q.Get("sessions"))
		if err != nil {
			return c, perr("sessions", "want true or false")
		}
		st.RequiresSession = b
	}
	if w[0] != "none" {
		d, err := time.ParseDuration(w[0])
		if err != nil || d < 20*time.Second || d > 7*24*time.Hour {
			return c, perr("window", "want a duration from 20s to 168h (Service Bus's range) or none")
		}
		st.RequiresDuplicateDetection, st.DuplicateDetectionWindow = true, d
	}
	if v := q.Get("ack_wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 5*time.Second || d > 5*time.Minute {
			return c, perr("ack_wait", "want a duration from 5s to 5m")
		}
		st.LockDuration = d
	}
	if v := q.Get("max_deliveries"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return c, perr("max_deliveries", "want a positive number")
		}
		st.MaxDeliveryCount = n
	}
	if v := q.Get("max_message_bytes"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1024 || n > 100<<20 {
			return c, perr("max_message_bytes", "want a number of bytes from 1024 to 104857600")
		}
		st.MaxMessageBytes = n
	}
	if create {
		c.Options.Create = &st
	} else {
		c.Options.Stated = &st
	}
	return c, nil
}

// connect reads the connection string and makes the SDK clients.
func (o *URLOpener) connect(u *url.URL) (URLConfig, *azservicebus.Client, error) {
	c, err := ParseURL(u)
	if err != nil {
		return c, nil, err
	}
	// The variable's name is a URL value and its content a secret: a
	// reason names the variable only when it is the default, and quotes
	// nothing read from it, not even the namespace (see dedupq.ParamError).
	which := "the variable conn_env names"
	if !u.Query().Has("conn_env") {
		which = "environment variable " + DefaultConnEnv
	}
	cs := os.Getenv(c.ConnEnv)
	if cs == "" {
		return c, nil, dedupq.NewParamError(u, "conn_env", which+" holds no connection string")
	}
	switch host, err := endpointHost(cs); {
	case err != nil:
		return c, nil, dedupq.NewParamError(u, "conn_env", fmt.Sprintf("the connection string in %s: %v", which, err))
	case !strings.EqualFold(host, c.Namespace):
		return c, nil, dedupq.NewParamError(u, "conn_env", "the connection string in "+which+" is for another namespace than the URL's host")
	}
	if c.Options.Stated == nil {
		a, err := admin.NewClientFromConnectionString(cs, nil)
		if err != nil {
			return c, nil, fmt.Errorf("dedupq/servicebus: management client: %w", connStringError(err, cs))
		}
		c.Options.Admin = a
	}
	opts := o.ClientOptions
	if opts == nil {
		opts = ClientOptions()
	}
	client, err := azservicebus.NewClientFromConnectionString(cs, opts)
	if err != nil {
		return c, nil, fmt.Errorf("dedupq/servicebus: %w", connStringError(err, cs))
	}
	return c, client, nil
}

// connStringError returns the SDK's error about the connection string cs,
// or an error with no text of its own when that text shows a value of cs
// (the SDK quotes the Endpoint, or a value it cannot parse).
func connStringError(err error, cs string) error {
	msg := err.Error()
	for part := range strings.SplitSeq(cs, ";") {
		if _, v, ok := strings.Cut(part, "="); ok && len(strings.TrimSpace(v)) >= 3 && strings.Contains(msg, strings.TrimSpace(v)) {
			return errors.New("the SDK refused the connection string (its message quoted the string, so it is not shown)")
		}
	}
	return err
}

// endpointHost is the host (and port) of a connection string's Endpoint.
func endpointHost(cs string) (string, error) {
	for part := range strings.SplitSeq(cs, ";") {
		k, v, _ := strings.Cut(part, "=")
		if strings.EqualFold(strings.TrimSpace(k), "Endpoint") {
			u, err := url.Parse(strings.TrimSpace(v))
			if err != nil || u.Host == "" {
				return "", errors.New("its Endpoint is not a URL like sb://myns.servicebus.windows.net")
			}
			return u.Host, nil
		}
	}
	return "", errors.New("it has no Endpoint")
}

// OpenTopic opens a Topic on the queue or topic the URL names.
func (o *URLOpener) OpenTopic(ctx context.Context, u *url.URL) (driver.Topic, error) {
	c, client, err := o.connect(u)
	if err != nil {
		return nil, err
	}
	s, err := client.NewSender(c.Entity.sendPath(), nil)
	if err != nil {
		return nil, errors.Join(err, client.Close(ctx))
	}
	t, err := openTopic(ctx, &ownedSender{batchSender: sdkSender{s}, client: client}, c.Entity, &c.Options)
	if err != nil {
		return nil, errors.Join(err, client.Close(ctx))
	}
	return t, nil
}

// OpenSubscription opens a Subscription on the queue or topic subscription
// the URL names, in peek-lock mode.
func (o *URLOpener) OpenSubscription(ctx context.Context, u *url.URL) (driver.Subscription, error) {
	c, client, err := o.connect(u)
	if err != nil {
		return nil, err
	}
	if c.Entity.Topic != "" && c.Entity.Subscription == "" {
		return nil, errors.Join(dedupq.NewParamError(u, "path", "a consumer needs a topic subscription: /topic/subscriptions/name"), client.Close(ctx))
	}
	// The entity decides how to receive: a session entity through the
	// sessions the Subscription accepts, any other through a Receiver.
	p, _, err := c.Options.read(ctx, c.Entity)
	if err != nil {
		return nil, errors.Join(err, client.Close(ctx))
	}
	var s *Subscription
	if p.RequiresSession {
		s, err = openSessionSubscription(ctx, sdkAcceptor{client: client, entity: c.Entity, owned: true}, c.Entity, &c.Options)
	} else {
		ropts := &azservicebus.ReceiverOptions{ReceiveMode: azservicebus.ReceiveModePeekLock}
		var r *azservicebus.Receiver
		if c.Entity.Queue != "" {
			r, err = client.NewReceiverForQueue(c.Entity.Queue, ropts)
		} else {
			r, err = client.NewReceiverForSubscription(c.Entity.Topic, c.Entity.Subscription, ropts)
		}
		if err != nil {
			return nil, errors.Join(err, client.Close(ctx))
		}
		s, err = openSubscription(ctx, &ownedReceiver{Receiver: r, client: client}, c.Entity, &c.Options)
	}
	if err != nil {
		return nil, errors.Join(err, client.Close(ctx))
	}
	return s, nil
}

// ownedSender closes the client the URL opener made with its sender.
type ownedSender struct {
	batchSender
	client *azservicebus.Client
}

func (s *ownedSender) Close(ctx context.Context) error {
	return errors.Join(s.batchSender.Close(ctx), s.client.Close(ctx))
}

// ownedReceiver closes the client the URL opener made with its receiver.
type ownedReceiver struct {
	*azservicebus.Receiver
	client *azservicebus.Client
}

func (r *ownedReceiver) Close(ctx context.Context) error {
	return errors.Join(r.Receiver.Close(ctx), r.client.Close(ctx))
}

// ClientOptions are the SDK client options the URL opener uses: one SDK
// retry, after a short delay, and no more. The Publisher and Consumer own
// the retry budget, but the SDK re-dials a lost connection and re-attaches
// a detached link only between the attempts of one call: with no retry at
// all (MaxRetries -1), a Sender or Receiver whose connection dropped (a
// broker restart, a network cut) fails every later call with the same
// connection-lost error and never recovers. The one retry runs inside the
// call's context, so it adds no time beyond the attempt's deadline; it may
// resend a message with the same MessageId, which duplicate detection
// drops within the window. Clients made for OpenTopic and OpenSubscription
// should use these options too.
func ClientOptions() *azservicebus.ClientOptions {
	return &azservicebus.ClientOptions{RetryOptions: azservicebus.RetryOptions{
		MaxRetries: 1, RetryDelay: 100 * time.Millisecond, MaxRetryDelay: time.Second,
	}}
}
