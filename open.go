package dedupq

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/urlvocab"
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
		// *url.Error quotes the whole URL, and some of its causes quote a
		// part of it (an invalid port, an escape): neither is shown.
		return nil, nil, fmt.Errorf("dedupq: malformed URL: %s", parseProblem(err))
	}
	if u.Scheme == "" {
		return nil, nil, fmt.Errorf("dedupq: URL %q has no scheme (want one of %s)", RedactURL(u), strings.Join(m.Schemes(), ", "))
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

// parseProblem says what url.Parse refused without quoting any of the URL.
func parseProblem(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ee url.EscapeError
	var he url.InvalidHostError
	switch {
	case errors.As(err, &ee):
		return "invalid %-escape"
	case errors.As(err, &he):
		return "invalid character in host"
	}
	// The other causes are fixed texts, some followed by a quoted part of
	// the URL ("invalid port \":x\" after host"): keep the text only.
	msg, _, _ := strings.Cut(err.Error(), `"`)
	return strings.TrimSpace(strings.TrimPrefix(msg, "net/url: "))
}

// OpenPublisher opens the backend named by rawURL and wraps it in a
// Publisher, running the same startup check as NewPublisher. Its error
// shows nothing of the URL that RedactURL hides, even where the driver's
// own text quoted it (an SDK quotes its endpoint); errors.Is and errors.As
// still find the driver's error. Neither do the errors the Publisher
// returns later (a PublishError's Err).
func (m *URLMux) OpenPublisher(ctx context.Context, rawURL string, opts PublisherOptions) (_ *Publisher, err error) {
	o, u, err := m.opener(rawURL)
	if err != nil {
		return nil, err
	}
	scrub := newScrubber(u)
	defer func() { err = scrub.err(err) }()
	t, err := o.OpenTopic(ctx, u)
	if err != nil {
		return nil, err
	}
	p, err := NewPublisher(ctx, t, opts)
	if err != nil {
		return nil, errors.Join(err, t.Close())
	}
	p.scrub = scrub
	return p, nil
}

// OpenConsumer opens the backend named by rawURL and wraps it in a
// Consumer, running the same startup check as NewConsumer. Its error
// shows nothing of the URL that RedactURL hides, as OpenPublisher's, and
// neither do the driver errors the Consumer logs or returns later.
func (m *URLMux) OpenConsumer(ctx context.Context, rawURL string, opts ConsumerOptions) (_ *Consumer, err error) {
	o, u, err := m.opener(rawURL)
	if err != nil {
		return nil, err
	}
	scrub := newScrubber(u)
	defer func() { err = scrub.err(err) }()
	s, err := o.OpenSubscription(ctx, u)
	if err != nil {
		return nil, err
	}
	c, err := NewConsumer(ctx, s, opts)
	if err != nil {
		return nil, errors.Join(err, s.Close())
	}
	c.scrub = scrub
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
// it from their openers, made by NewParamError, so that every backend names
// the parameter the same way and shows the URL the same way.
//
// A URL may carry secrets by mistake (a SharedAccessKey, a token in the
// user-info, an unknown aws_secret_access_key parameter), so a ParamError
// shows only what RedactURL does, which is no value that could be one: URL
// is the RedactURL form, Param is a parameter name, and Reason says what
// is wrong and what is wanted without quoting the value it refuses.
type ParamError struct {
	// URL is the URL as RedactURL shows it.
	URL string
	// Param names the parameter ("host", "query" or "path" for those
	// parts of the URL).
	Param string
	// Reason says what is wrong; it quotes no value from the URL.
	Reason string
}

// NewParamError returns a *ParamError about param of u. A param that is
// not a plain parameter name (letters, digits, '_', '-', '.', at most 64)
// is reported as "query", since it may be a value pasted without a name.
func NewParamError(u *url.URL, param, reason string) *ParamError {
	if !plainName(param) {
		param = "query"
	}
	return &ParamError{URL: RedactURL(u), Param: param, Reason: reason}
}

// Error implements the error interface. It redacts URL and Param again,
// for a ParamError made without NewParamError.
func (e *ParamError) Error() string {
	shown := "(not shown)"
	if u, err := url.Parse(e.URL); err == nil {
		shown = RedactURL(u)
	}
	param := e.Param
	if !plainName(param) {
		param = "query"
	}
	return fmt.Sprintf("dedupq: URL %q: parameter %q: %s", shown, param, e.Reason)
}

// Redacted is what RedactURL puts in place of a hidden part.
const Redacted = "REDACTED"

// RedactURL returns u as errors and logs may show it: the scheme, the host
// and the path, the query's parameter names, and the values a user needs
// to read back that carry no secret; every other query value, the
// user-info and the fragment are replaced by REDACTED (and a query part
// without '=', which may be a value pasted without a name). The host and
// the path name the resource, which a reader needs to act on the error,
// and carry no secret in any backend's URL form; they are shown only when
// they look like names (no '=', ';', '+', '&', '%', spaces or controls),
// so that a connection string or key pasted there is hidden too. A query
// value is shown only when it is of a parameter of the scheme's known
// vocabulary whose values are checked to be harmless (durations, counts,
// booleans, fixed words, names under the backend's rules) and passes that
// check: credentials, unknown parameters and whatever may carry a secret
// (endpoints, variable names) are hidden, and so is a value that fails
// its check, as a secret pasted into the wrong parameter does. An empty
// value is shown as empty.
func RedactURL(u *url.URL) string {
	shown, _ := redact(u)
	return shown
}

// redact is RedactURL, and also returns the parts of u it hid, as u holds
// them, for scrubbing them out of a driver's text.
func redact(u *url.URL) (shown string, hidden []string) {
	if u == nil {
		return "", nil
	}
	var b strings.Builder
	hide := func(parts ...string) {
		b.WriteString(Redacted)
		hidden = append(hidden, parts...)
	}
	nameOrHidden := func(s string, re *regexp.Regexp) {
		if re.MatchString(s) {
			b.WriteString(s)
		} else {
			hide(s)
		}
	}
	if u.Scheme != "" {
		nameOrHidden(u.Scheme, schemeRE)
		b.WriteByte(':')
	}
	if u.Opaque != "" {
		nameOrHidden(u.Opaque, pathRE)
	} else {
		if u.Host != "" || u.User != nil || (u.Scheme != "" && u.Path != "" && !u.OmitHost) {
			b.WriteString("//")
		}
		if u.User != nil {
			pw, _ := u.User.Password()
			hide(u.User.String(), u.User.Username(), pw)
			b.WriteByte('@')
		}
		nameOrHidden(u.Host, hostRE)
		if u.Path != "" {
			if u.Host != "" && !strings.HasPrefix(u.Path, "/") {
				b.WriteByte('/')
			}
			if pathRE.MatchString(u.Path) {
				b.WriteString(u.Path)
			} else {
				if strings.HasPrefix(u.Path, "/") {
					b.WriteByte('/')
				}
				hide(u.Path, u.RawPath)
			}
		}
	}
	if u.RawQuery != "" || u.ForceQuery {
		b.WriteByte('?')
		for i, piece := range strings.Split(u.RawQuery, "&") {
			if i > 0 {
				b.WriteByte('&')
			}
			k, v, hasValue := strings.Cut(piece, "=")
			// A piece without '=' may be a value pasted without a name.
			if name, err := url.QueryUnescape(k); err == nil && hasValue && plainName(name) {
				b.WriteString(name)
			} else if k != "" {
				hide(k)
			}
			if hasValue {
				b.WriteByte('=')
				name, nerr := url.QueryUnescape(k)
				value, verr := url.QueryUnescape(v)
				switch {
				case v == "":
				case nerr == nil && verr == nil && urlvocab.Shown(u.Scheme, name, value):
					// As written: it differs from value by escapes at most.
					b.WriteString(v)
				default:
					hide(v)
				}
			}
		}
	}
	if u.Fragment != "" || u.RawFragment != "" {
		b.WriteByte('#')
		hide(u.Fragment, u.RawFragment)
	}
	return b.String(), hidden
}

var (
	schemeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*$`)
	// hostRE: names, IPv4, [IPv6] with a zone, and a port.
	hostRE = regexp.MustCompile(`^[A-Za-z0-9._~:\[\]%-]*$`)
	// pathRE: the decoded path, without the characters of key=value
	// lists, base64 and escapes.
	pathRE = regexp.MustCompile(`^[A-Za-z0-9._~/:@!$'()*,-]*$`)
	nameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
)

func plainName(s string) bool { return nameRE.MatchString(s) }

// QueryParams reads u's query for an adapter's URL opener: every parameter
// must be one of known and given once. Names are case-sensitive,
// lower-case snake_case, and the same concept has the same name on every
// backend (window, ack_wait, max_deliveries, backoff, max_batch). A
// parameter whose name suggests a credential (SharedAccessKey, token,
// password, aws_secret_access_key, …) is refused with credentialHint,
// which says where the backend's credentials belong instead. Any other
// unknown parameter is refused with a hint when one fits: the known name
// it differs from only in case or separators (Window, ackWait), the name
// dedupq uses for a broker's own setting (visibility_timeout is ack_wait),
// or the other backends that take it (durable is a jetstream parameter).
// Every error is a *ParamError, and none shows a value: the adapter then
// reads the values, and must not quote them either when it refuses one.
func QueryParams(u *url.URL, known []string, credentialHint string) (url.Values, error) {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		reason := "malformed: parameters are name=value pairs separated by '&'"
		var ee url.EscapeError
		if errors.As(err, &ee) {
			reason = "malformed: an invalid %-escape"
		}
		return nil, NewParamError(u, "query", reason)
	}
	for piece := range strings.SplitSeq(u.RawQuery, "&") {
		if piece != "" && !strings.Contains(piece, "=") {
			// It may be a value pasted without a name: not named.
			return nil, NewParamError(u, "query", "a parameter without '=': parameters are name=value pairs")
		}
	}
	// Sorted, so that a URL with several problems always reports the same.
	for _, k := range slices.Sorted(maps.Keys(q)) {
		switch {
		case k == "":
			return nil, NewParamError(u, "query", "a parameter without a name")
		case slices.Contains(known, k):
		case credentialName(k):
			return nil, NewParamError(u, k, "credentials never go in a URL: "+credentialHint)
		default:
			reason := "unknown parameter"
			if h := urlvocab.Hint(u.Scheme, k, known); h != "" {
				reason += ": " + h
			}
			return nil, NewParamError(u, k, fmt.Sprintf("%s (known: %s)", reason, strings.Join(known, ", ")))
		}
		if n := len(q[k]); n > 1 {
			return nil, NewParamError(u, k, fmt.Sprintf("given %d times", n))
		}
	}
	return q, nil
}

// credentialName reports whether a parameter name suggests a credential.
func credentialName(k string) bool {
	n := strings.NewReplacer("_", "", "-", "", ".", "").Replace(strings.ToLower(k))
	switch n {
	case "key", "sas", "sig", "pwd", "pass", "auth":
		return true
	}
	for _, s := range []string{"password", "passwd", "secret", "token", "signature", "sharedaccess", "credential",
		"apikey", "accesskey", "privatekey", "connectionstring", "connstr"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}
