package jetstream

import (
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq"
)

// Scheme is the URL scheme this package registers with dedupq.Register.
const Scheme = "jetstream"

// DefaultPort is the NATS client port assumed when a URL names none.
const DefaultPort = "4222"

// DefaultMaxBatch is how many messages SendBatch publishes concurrently
// when Config.MaxBatch is zero: enough to keep a connection busy, few
// enough that one slow batch does not hold many messages in doubt.
const DefaultMaxBatch = 1024

// Config names the stream, subject and durable a Topic or Subscription uses
// and, for what this package creates, how to create it. Fields that
// describe an entity (Duplicates, AckWait, MaxDeliver, BackOff) are used
// when this package creates it and are otherwise asserted: opening fails
// when the live entity differs, so that a program never runs on a window
// or redelivery policy other than the one it states.
type Config struct {
	// Stream is the stream's name. Required.
	Stream string
	// Subject is the subject published to; a message's GroupKey is
	// appended to it as one more token. Required.
	Subject string
	// Durable is the durable pull consumer's name. Required by
	// OpenSubscription; created with AckPolicy explicit when missing.
	Durable string

	// CreateStream creates the stream when it does not exist, with the
	// subjects Subject and Subject+".>".
	CreateStream bool
	// Storage is a created stream's storage; the zero value is file.
	Storage jetstream.StorageType
	// Duplicates is the stream's dedup window (at least 100ms). Zero
	// means the server's default (two minutes) for a created stream, and
	// no assertion for an existing one.
	Duplicates time.Duration

	// AckWait is the consumer's ack timeout; zero means the server's
	// default (30s) for a created durable. With BackOff the server uses
	// BackOff[0] instead.
	AckWait time.Duration
	// MaxDeliver bounds deliveries per message; zero means the server's
	// default for a created durable, which is unlimited (-1). The
	// consumer-side dedup check needs a bound.
	MaxDeliver int
	// BackOff replaces AckWait per delivery; see the package doc.
	BackOff []time.Duration

	// MaxBatch is how many messages one SendBatch publishes concurrently;
	// zero means DefaultMaxBatch.
	MaxBatch int
}

// configProblem is one thing wrong with a Config, named by its URL
// parameter.
type configProblem struct{ param, reason string }

// fieldOf names the Config field behind each URL parameter.
var fieldOf = map[string]string{
	"stream": "Stream", "subject": "Subject", "durable": "Durable", "storage": "Storage",
	"window": "Duplicates", "ack_wait": "AckWait", "max_deliveries": "MaxDeliver",
	"backoff": "BackOff", "max_batch": "MaxBatch",
}

// validate checks what OpenTopic and OpenSubscription need, naming the field.
func (c *Config) validate(needDurable bool) error {
	if p := c.check(needDurable); p != nil {
		return fmt.Errorf("jetstream: Config.%s: %s", fieldOf[p.param], p.reason)
	}
	return nil
}

// check is validate's rule, naming the URL parameter, so that ParseURL can
// report a *dedupq.ParamError.
func (c *Config) check(needDurable bool) *configProblem {
	bad := func(param, format string, args ...any) *configProblem {
		return &configProblem{param, fmt.Sprintf(format, args...)}
	}
	if r := nameProblem(c.Stream); r != "" {
		return bad("stream", "%s", r)
	}
	if r := subjectProblem(c.Subject); r != "" {
		return bad("subject", "%s", r)
	}
	if needDurable || c.Durable != "" {
		if r := nameProblem(c.Durable); r != "" {
			return bad("durable", "%s", r)
		}
	}
	if c.Storage != jetstream.FileStorage && c.Storage != jetstream.MemoryStorage {
		return bad("storage", "unknown storage type %d", c.Storage)
	}
	if c.Duplicates != 0 && c.Duplicates < 100*time.Millisecond {
		return bad("window", "%s is below the server's minimum of 100ms", c.Duplicates)
	}
	if c.AckWait < 0 {
		return bad("ack_wait", "negative")
	}
	if c.MaxDeliver < -1 {
		return bad("max_deliveries", "%d: use -1 for unlimited or a positive bound", c.MaxDeliver)
	}
	for _, b := range c.BackOff {
		if b <= 0 {
			return bad("backoff", "entries must be positive")
		}
	}
	if len(c.BackOff) > 0 && c.MaxDeliver > 0 && len(c.BackOff) > c.MaxDeliver {
		return bad("backoff", "%d entries but at most %d deliveries; the server needs a delivery for each entry", len(c.BackOff), c.MaxDeliver)
	}
	if c.MaxBatch < 0 {
		return bad("max_batch", "negative")
	}
	return nil
}

// nameProblem says what makes s unusable as a stream or consumer name, the
// server's rule: non-empty, no whitespace, no '.', '*', '>', no path
// separators. Control characters and non-ASCII are refused too, because
// names become subject tokens and file names.
func nameProblem(s string) string {
	switch {
	case s == "":
		return "missing"
	case len(s) > 255:
		return "longer than 255 bytes"
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(".*>/\\", c) >= 0 {
			return fmt.Sprintf("character %q at byte %d is not allowed in a name", c, i)
		}
	}
	return ""
}

// subjectProblem says what makes s unusable as a publish subject: tokens of
// printable ASCII without wildcards, separated by single dots.
func subjectProblem(s string) string {
	if s == "" {
		return "missing"
	}
	if len(s) > 1024 {
		return "longer than 1024 bytes"
	}
	for i, tok := range strings.Split(s, ".") {
		if tok == "" {
			return fmt.Sprintf("token %d is empty", i+1)
		}
		if tok == "*" || tok == ">" || strings.ContainsAny(tok, "*>") {
			return "wildcards cannot be published to"
		}
		for j := 0; j < len(tok); j++ {
			if c := tok[j]; c <= ' ' || c >= 0x7f {
				return fmt.Sprintf("character %q is not allowed in a subject", c)
			}
		}
	}
	return ""
}

// hostRE matches a host name, an IPv4 address or an IPv6 address (with a
// zone), as url.URL.Hostname returns them.
var hostRE = regexp.MustCompile(`^[A-Za-z0-9.-]+$|^[0-9A-Fa-f:.]+(%[A-Za-z0-9._-]+)?$`)

// knownParams lists every URL parameter, in the order URL writes them.
var knownParams = []string{"subject", "durable", "create", "storage", "window", "ack_wait", "max_deliveries", "backoff", "max_batch"}

// ParseURL reads a jetstream:// URL into the NATS server URL to dial and a
// Config. It does not require durable, which only consuming needs. Every
// error is a *dedupq.ParamError naming the parameter ("stream" for the
// path, "host" for the address), and none quotes a value from the URL: the
// user-info may hold a NATS token or password.
func ParseURL(u *url.URL) (server string, cfg Config, err error) {
	bad := func(param, format string, args ...any) error {
		return dedupq.NewParamError(u, param, fmt.Sprintf(format, args...))
	}
	if u.Scheme != Scheme {
		return "", Config{}, bad("scheme", "want %s://", Scheme)
	}
	if u.Opaque != "" {
		return "", Config{}, bad("host", "write the URL as %s://host:port/STREAM?subject=…", Scheme)
	}
	if u.Fragment != "" || u.RawFragment != "" {
		return "", Config{}, bad("fragment", "a %s URL has no fragment", Scheme)
	}
	host, port := u.Hostname(), u.Port()
	if strings.Contains(u.Host, ",") {
		return "", Config{}, bad("host", "one server per URL")
	}
	if host == "" {
		if u.Host != "" && !strings.HasPrefix(u.Host, ":") {
			return "", Config{}, bad("host", "malformed address: want HOST:PORT")
		}
		host = "127.0.0.1"
	}
	// The client quotes the host in its errors: only a name or an address.
	if !hostRE.MatchString(host) {
		return "", Config{}, bad("host", "not a host name or IP address")
	}
	if port == "" {
		if strings.HasSuffix(u.Host, ":") {
			return "", Config{}, bad("host", "empty port")
		}
		port = DefaultPort
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", Config{}, bad("host", "port %q is not a number from 1 to 65535", port)
	}
	nu := url.URL{Scheme: "nats", User: u.User, Host: net.JoinHostPort(host, port)}
	server = nu.String()

	path := strings.TrimPrefix(u.Path, "/")
	if path == "" {
		return "", Config{}, bad("stream", "missing: name the stream in the path, as in %s://HOST:PORT/ORDERS?subject=orders", Scheme)
	}
	if strings.Contains(path, "/") {
		return "", Config{}, bad("stream", "the path is one stream name, without '/'")
	}
	if r := nameProblem(path); r != "" {
		return "", Config{}, bad("stream", "%s", r)
	}
	cfg.Stream = path

	q, err := dedupq.QueryParams(u, knownParams, "give them in the user-info (jetstream://user:password@host or jetstream://token@host) or as URLOpener.Options")
	if err != nil {
		return "", Config{}, err
	}
	get := func(k string) (string, bool) {
		vs, ok := q[k]
		if !ok {
			return "", false
		}
		return vs[0], true
	}
	dur := func(k string, min time.Duration) (time.Duration, error) {
		v, ok := get(k)
		if !ok {
			return 0, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			return 0, bad(k, "not a duration such as 30s or 2m")
		}
		if d < min {
			return 0, bad(k, "%s is below the minimum of %s", d, min)
		}
		return d, nil
	}

	v, ok := get("subject")
	if !ok {
		return "", Config{}, bad("subject", "missing: add ?subject=… naming the subject to publish to")
	}
	if r := subjectProblem(v); r != "" {
		return "", Config{}, bad("subject", "%s", r)
	}
	cfg.Subject = v
	if v, ok := get("durable"); ok {
		if r := nameProblem(v); r != "" {
			return "", Config{}, bad("durable", "%s", r)
		}
		cfg.Durable = v
	}
	if v, ok := get("create"); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return "", Config{}, bad("create", "want true or false")
		}
		cfg.CreateStream = b
	}
	if v, ok := get("storage"); ok {
		switch v {
		case "file":
			cfg.Storage = jetstream.FileStorage
		case "memory":
			cfg.Storage = jetstream.MemoryStorage
		default:
			return "", Config{}, bad("storage", "want file or memory")
		}
	}
	if cfg.Duplicates, err = dur("window", 100*time.Millisecond); err != nil {
		return "", Config{}, err
	}
	if cfg.AckWait, err = dur("ack_wait", time.Millisecond); err != nil {
		return "", Config{}, err
	}
	if v, ok := get("max_deliveries"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n == 0 || n < -1 {
			return "", Config{}, bad("max_deliveries", "want -1 (unlimited) or a positive number")
		}
		cfg.MaxDeliver = n
	}
	if v, ok := get("backoff"); ok {
		for _, part := range strings.Split(v, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(part))
			if err != nil || d <= 0 {
				return "", Config{}, bad("backoff", "want a comma-separated list of positive durations")
			}
			cfg.BackOff = append(cfg.BackOff, d)
		}
	}
	if v, ok := get("max_batch"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return "", Config{}, bad("max_batch", "want a positive number")
		}
		cfg.MaxBatch = n
	}
	if p := cfg.check(false); p != nil {
		return "", Config{}, bad(p.param, "%s", p.reason)
	}
	return server, cfg, nil
}

// URL writes c as a jetstream:// URL for the NATS server at server, which
// may be "host:port" or a nats:// URL such as the one embedded.Run returns.
// ParseURL reads it back to c.
func (c Config) URL(server string) string {
	host := server
	var user *url.Userinfo
	if u, err := url.Parse(server); err == nil && u.Host != "" {
		host, user = u.Host, u.User
	}
	q := make([]string, 0, len(knownParams))
	add := func(k, v string) { q = append(q, k+"="+url.QueryEscape(v)) }
	add("subject", c.Subject)
	if c.Durable != "" {
		add("durable", c.Durable)
	}
	if c.CreateStream {
		add("create", "true")
	}
	if c.Storage == jetstream.MemoryStorage {
		add("storage", "memory")
	}
	if c.Duplicates != 0 {
		add("window", c.Duplicates.String())
	}
	if c.AckWait != 0 {
		add("ack_wait", c.AckWait.String())
	}
	if c.MaxDeliver != 0 {
		add("max_deliveries", strconv.Itoa(c.MaxDeliver))
	}
	if len(c.BackOff) > 0 {
		parts := make([]string, len(c.BackOff))
		for i, b := range c.BackOff {
			parts[i] = b.String()
		}
		add("backoff", strings.Join(parts, ","))
	}
	if c.MaxBatch != 0 {
		add("max_batch", strconv.Itoa(c.MaxBatch))
	}
	u := url.URL{Scheme: Scheme, User: user, Host: host, Path: "/" + c.Stream, RawQuery: strings.Join(q, "&")}
	return u.String()
}
