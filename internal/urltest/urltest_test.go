// Talks to: no service. URLs that fail validation must fail before any
// dial; accepted jetstream URLs, and sqs URLs with an endpoint, dial a
// loopback port nothing listens on, accepted mem URLs open in-process
// brokers, accepted servicebus URLs stop at a missing connection-string
// variable, and other accepted sqs URLs and pubsub URLs are not opened
// (they would reach AWS or Google). It also reads ../../README.md, whose
// parameter table must match the adapters.
package urltest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/jetstream"
	_ "github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/adapters/pubsub"
	"github.com/dedupq/dedupq/adapters/servicebus"
	"github.com/dedupq/dedupq/adapters/sqs"
	"github.com/dedupq/dedupq/internal/urlvocab"
	"github.com/dedupq/dedupq/window"
)

// marker is planted wherever a secret could be; no error may show it.
const marker = "Zq9SeCrEt"

// scheme is one adapter as this test drives it.
type scheme struct {
	name string
	// base is a URL the adapter accepts, with a query.
	base string
	// known are the adapter's parameters.
	known []string
	// parse is the adapter's validation, which touches no network; nil
	// means opening itself touches none (mem).
	parse func(*url.URL) error
	// openable says whether an accepted URL may be opened here, without
	// reaching anything outside the process; nil means never.
	openable func(*url.URL) bool
}

// unsetEnv names a connection-string variable no test sets.
const unsetEnv = "DEDUPQ_URLTEST_UNSET"

// schemes are the registered schemes; their URLs that can be opened
// reach addr, a loopback port nothing listens on, or nothing at all.
func schemes(t testing.TB, addr string) []scheme {
	t.Helper()
	return []scheme{
		{
			name:     "mem",
			base:     "mem://urltest?window=2m",
			known:    urlvocab.Params("mem"),
			openable: func(*url.URL) bool { return true },
		},
		{
			name:     "jetstream",
			base:     "jetstream://" + addr + "/S?subject=s&durable=d",
			known:    urlvocab.Params("jetstream"),
			parse:    func(u *url.URL) error { _, _, err := jetstream.ParseURL(u); return err },
			openable: func(u *url.URL) bool { return u.Host == addr },
		},
		{
			name:  "sqs",
			base:  "sqs://q.fifo?region=eu-west-1&endpoint=http://" + addr + "/",
			known: urlvocab.Params("sqs"),
			parse: func(u *url.URL) error { _, _, _, _, err := sqs.ParseURL(u); return err },
			// The SDK then talks to the endpoint only (see offlineAWS).
			openable: func(u *url.URL) bool {
				e, err := url.Parse(u.Query().Get("endpoint"))
				return err == nil && e.Host == addr
			},
		},
		{
			name:  "pubsub",
			base:  "pubsub://p1x/orders?emulator=127.0.0.1:8085",
			known: urlvocab.Params("pubsub"),
			parse: func(u *url.URL) error { _, err := pubsub.ParseURL(u); return err },
		},
		{
			name:  "servicebus",
			base:  "servicebus://ns.servicebus.windows.net/orders?conn_env=" + unsetEnv + "&window=10m",
			known: urlvocab.Params("servicebus"),
			parse: func(u *url.URL) error { _, err := servicebus.ParseURL(u); return err },
			// Opening stops at the missing connection string.
			openable: func(u *url.URL) bool {
				c, err := servicebus.ParseURL(u)
				return err == nil && os.Getenv(c.ConnEnv) == ""
			},
		},
	}
}

// refusingAddr is a loopback address nothing listens on: dials to it fail
// at once.
func refusingAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// showsMarker reports where err shows the marker, if anywhere: its text,
// its %+v form, and the fields of a *dedupq.ParamError in it.
func showsMarker(err error) string {
	texts := []string{err.Error(), fmt.Sprintf("%+v", err)}
	var pe *dedupq.ParamError
	if errors.As(err, &pe) {
		texts = append(texts, fmt.Sprintf("%#v", *pe))
	}
	return textShowing(texts...)
}

// textShowing returns the first of texts that shows the marker, in any
// case, or "".
func textShowing(texts ...string) string {
	for _, s := range texts {
		if strings.Contains(strings.ToLower(s), strings.ToLower(marker)) {
			return s
		}
	}
	return ""
}

// inspectionTexts are the texts dedupq check prints of an Inspection.
func inspectionTexts(in *dedupq.Inspection) []string {
	texts := []string{in.URL, in.Window.String(), in.ConsumerWindow.String(), in.Redelivery.String(), in.Retry.String()}
	for _, err := range []error{in.Publisher, in.Consumer} {
		if err != nil {
			texts = append(texts, err.Error())
			var ue *window.UnsafeRetryError
			if errors.As(err, &ue) {
				texts = append(texts, ue.Fixes...)
			}
		}
	}
	return texts
}

// outcome is what checkURL saw.
type outcome int

const (
	unparsable outcome = iota
	refused
	accepted
)

// checkURL validates raw with sch and opens it where that is safe,
// failing t if any error, any text of Inspect's and any log line shows
// the marker. A URL the adapter refuses must fail to open too, without
// dialing (the jetstream address refuses, and the others would fail with
// a network error other than a ParamError).
func checkURL(t *testing.T, sch scheme, raw string, openAccepted bool) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			return
		}
		if s := showsMarker(err); s != "" {
			t.Errorf("%s of %q shows the planted secret: %s", what, raw, s)
		}
	}
	openBoth := func() (pubErr, conErr error) {
		t.Helper()
		p, pubErr := dedupq.OpenPublisher(ctx, raw, dedupq.PublisherOptions{})
		if pubErr == nil {
			p.Close(ctx)
		}
		var logs bytes.Buffer
		c, conErr := dedupq.OpenConsumer(ctx, raw, dedupq.ConsumerOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if conErr == nil {
			c.Close(ctx)
		}
		in, inErr := dedupq.Inspect(ctx, raw, dedupq.InspectOptions{DedupTTL: time.Minute})
		check("OpenPublisher", pubErr)
		check("OpenConsumer", conErr)
		check("Inspect", inErr)
		if s := textShowing(logs.String()); s != "" {
			t.Errorf("the consumer's log of %q shows the planted secret: %s", raw, s)
		}
		if in != nil {
			if s := textShowing(inspectionTexts(in)...); s != "" {
				t.Errorf("Inspect of %q shows the planted secret: %s", raw, s)
			}
		}
		return pubErr, conErr
	}
	u, err := url.Parse(raw)
	if err != nil {
		pubErr, _ := openBoth()
		if pubErr == nil {
			t.Errorf("OpenPublisher(%q) opened a URL that does not parse", raw)
		}
		return unparsable
	}
	if s := dedupq.RedactURL(u); strings.Contains(strings.ToLower(s), strings.ToLower(marker)) {
		t.Errorf("RedactURL(%q) = %q", raw, s)
	}
	if sch.parse == nil {
		if openAccepted && sch.openable(u) {
			if pubErr, conErr := openBoth(); pubErr != nil && conErr != nil {
				return refused
			}
		}
		return accepted
	}
	if err := sch.parse(u); err != nil {
		check("ParseURL", err)
		var pe *dedupq.ParamError
		if !errors.As(err, &pe) {
			t.Errorf("ParseURL(%q) = %v, want a *dedupq.ParamError", raw, err)
		}
		pubErr, conErr := openBoth()
		if !errors.As(pubErr, &pe) || !errors.As(conErr, &pe) {
			t.Errorf("opening refused URL %q: %v / %v, want ParamErrors before any dial", raw, pubErr, conErr)
		}
		return refused
	}
	if openAccepted && sch.openable != nil && sch.openable(u) {
		openBoth()
	}
	return accepted
}

// plantCase is one place a secret could be put.
type plantCase struct {
	name string
	raw  string
	// mustRefuse says the adapter must refuse the URL.
	mustRefuse bool
}

func plants(t *testing.T, sch scheme, addr string) []plantCase {
	base, err := url.Parse(sch.base)
	if err != nil {
		t.Fatal(err)
	}
	with := func(k, v string) string {
		u := *base
		q := u.Query()
		q.Set(k, v)
		u.RawQuery = q.Encode()
		return u.String()
	}
	var cs []plantCase
	for _, k := range []string{"SharedAccessKey", "SharedAccessSignature", "token", "aws_secret_access_key", "password", "key", "colour"} {
		cs = append(cs, plantCase{"param " + k, with(k, marker), true})
	}
	for _, k := range sch.known {
		cs = append(cs,
			plantCase{"value of " + k, with(k, marker+"!"), false},
			plantCase{"value of " + k + " with a space", with(k, " "+marker), false},
			plantCase{"bad escape in " + k, sch.base + "&" + k + "=" + marker + "%zz", true},
			// A name-shaped value of a name parameter is shown: the '!'
			// keeps it a secret's shape.
			plantCase{k + " twice", sch.base + "&" + k + "=" + marker + "%21&" + k + "=" + marker + "2%21", true},
		)
	}
	scheme, rest, _ := strings.Cut(sch.base, "://")
	host, path, _ := strings.Cut(rest, "/")
	if i := strings.IndexAny(host, "?"); i >= 0 {
		host, path = host[:i], host[i:]
	} else {
		path = "/" + path
	}
	userinfoRefused := sch.name == "sqs" || sch.name == "pubsub" || sch.name == "servicebus"
	cs = append(cs,
		plantCase{"bare value", sch.base + "&" + marker, true},
		plantCase{"semicolon", sch.base + "&a=" + marker + ";b=1", true},
		plantCase{"password", scheme + "://user:" + marker + "@" + rest, userinfoRefused},
		plantCase{"token as user", scheme + "://" + marker + "@" + rest, userinfoRefused},
		plantCase{"fragment", sch.base + "#" + marker, false},
		plantCase{"connection string as path", scheme + "://" + host + "/;SharedAccessKey=" + marker, true},
		plantCase{"connection string as host", scheme + "://ns;SharedAccessKey=" + marker + path, true},
	)
	// In each value, as a name where that is hidden (the endpoint's path,
	// the variable conn_env names), and in a shape no shown parameter
	// takes.
	for i, raw := range plantings(base, addr) {
		cs = append(cs, plantCase{fmt.Sprintf("planting %d", i), raw, false})
	}
	return cs
}

// TestURLErrorsNeverShowSecrets plants a secret in every kind of place of
// every registered scheme's URL: no error, from validation or from
// opening, shows it.
func TestURLErrorsNeverShowSecrets(t *testing.T) {
	offlineAWS(t)
	addr := refusingAddr(t)
	all := schemes(t, addr)
	var names []string
	for _, s := range all {
		names = append(names, s.name)
	}
	if got := dedupq.DefaultURLMux().Schemes(); !slices.Equal(got, slices.Sorted(slices.Values(names))) {
		t.Fatalf("registered schemes %v, this test covers %v: add the new adapter here", got, names)
	}
	for _, sch := range all {
		for _, pc := range plants(t, sch, addr) {
			t.Run(sch.name+"/"+pc.name, func(t *testing.T) {
				if got := checkURL(t, sch, pc.raw, true); pc.mustRefuse && got == accepted {
					t.Errorf("%q was accepted, want it refused", pc.raw)
				}
			})
		}
	}
}

// TestServiceBusConnectionStringNeverShown: the connection string comes
// from the environment and is a secret as a whole; errors about it quote
// nothing of it.
func TestServiceBusConnectionStringNeverShown(t *testing.T) {
	const env = "DEDUPQ_URLTEST_SB"
	raw := "servicebus://ns.servicebus.windows.net/orders?conn_env=" + env + "&window=10m"
	for _, cs := range []string{
		"Endpoint=sb://other.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=" + marker,
		"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=" + marker + ";UseDevelopmentEmulator=" + marker,
		"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=" + marker,
		"SharedAccessKey=" + marker,
		"Endpoint=sb://" + marker + "%zz/;SharedAccessKey=" + marker,
		"Endpoint=sb://ns.servicebus.windows.net/;" + marker,
	} {
		t.Run(cs, func(t *testing.T) {
			t.Setenv(env, cs)
			_, err := dedupq.OpenPublisher(t.Context(), raw, dedupq.PublisherOptions{})
			if err == nil {
				t.Fatal("opened with a bad connection string")
			}
			if s := showsMarker(err); s != "" {
				t.Errorf("error shows the connection string: %s", s)
			}
		})
	}
}

// FuzzURLErrorsNeverEchoQuery: for any URL, of any registered scheme, with
// the marker planted in every query value (an endpoint's path, the
// variable conn_env names, the values of shown parameters), the
// user-info and the fragment, no error, no text of Inspect's and no log
// line shows the marker. Accepted URLs are opened where that reaches
// nothing outside the process (see schemes); refused URLs of every scheme
// are opened too, and must fail before dialing.
func FuzzURLErrorsNeverEchoQuery(f *testing.F) {
	offlineAWS(f)
	addr := refusingAddr(f)
	all := schemes(f, addr)
	for _, s := range all {
		_, rest, _ := strings.Cut(s.base, "://")
		f.Add(rest)
		f.Add(rest + "&colour=blue#frag")
		f.Add("user:pw@" + rest + "&token=x")
	}
	for _, s := range []string{"h/S?subject=a&backoff=1s,,2s&max_deliveries=x", "q.fifo?endpoint=http://u:p@h:1/?x=1",
		"q.fifo?region=eu-west-1&endpoint=https://" + addr + "/a/b/&group=g", "ns/t/subscriptions/s?kind=queue&x",
		"ns/q?window=1m&conn_env=SB_CONN", "p/orders?emulator=a@b:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rest string) {
		if strings.Contains(strings.ToLower(rest), strings.ToLower(marker)) {
			return
		}
		for _, sch := range all {
			u, err := url.Parse(sch.name + "://" + rest)
			if err != nil {
				continue
			}
			for _, raw := range plantings(u, addr) {
				checkURL(t, sch, raw, true)
			}
		}
	})
}

// plantings are u with the marker planted: in every query value at once
// after a '!', and in each value alone, both as a name and after a '!';
// in the user-info and the fragment (see plant).
func plantings(u *url.URL, addr string) []string {
	n := 0
	if u.RawQuery != "" {
		n = strings.Count(u.RawQuery, "&") + 1
	}
	out := []string{plant(u, addr, -1, true)}
	for i := range n {
		out = append(out, plant(u, addr, i, false), plant(u, addr, i, true))
	}
	return slices.Compact(out)
}

// plant is u with the marker appended to query piece i (every piece when
// i < 0), the user-info and the fragment. A value that is an http(s) URL
// gets it in its path instead, and addr as its host, so that opening it
// reaches nothing outside the process. The marker is appended as a name,
// unless bang or unless the value would then be shown (a name parameter
// shows a name): then after a '!', which no shown value has.
func plant(u *url.URL, addr string, i int, bang bool) string {
	v := *u
	if v.RawQuery != "" {
		pieces := strings.Split(v.RawQuery, "&")
		for j, p := range pieces {
			if i >= 0 && j != i {
				continue
			}
			k, val, ok := strings.Cut(p, "=")
			name, nerr := url.QueryUnescape(k)
			value, verr := url.QueryUnescape(val)
			switch {
			case !ok:
				if p != "" {
					pieces[j] = p + marker
				}
			case nerr != nil || verr != nil:
				pieces[j] = p + "%21" + marker
			default:
				if e, err := url.Parse(value); err == nil && (e.Scheme == "http" || e.Scheme == "https") && e.Host != "" {
					e.Host = addr
					e.Path = strings.TrimSuffix(e.Path, "/") + "/" + marker
					if bang {
						e.Path += "!"
					}
					value = e.String()
				} else if plain := value + marker; !bang && !urlvocab.Shown(v.Scheme, name, plain) {
					value = plain
				} else {
					value += "!" + marker
				}
				pieces[j] = k + "=" + url.QueryEscape(value)
			}
		}
		v.RawQuery = strings.Join(pieces, "&")
	}
	if v.User != nil {
		if pw, ok := v.User.Password(); ok {
			v.User = url.UserPassword(v.User.Username()+marker, pw+marker)
		} else {
			v.User = url.User(v.User.Username() + marker)
		}
	}
	if v.Fragment != "" || v.RawFragment != "" {
		v.Fragment, v.RawFragment = v.Fragment+marker, ""
	}
	return v.String()
}

// parseErr validates raw with sch's parser, or for mem, which has none of
// its own, opens a consumer (a refused mem URL touches no broker).
func parseErr(t *testing.T, sch scheme, raw string) *dedupq.ParamError {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if sch.parse != nil {
		err = sch.parse(u)
	} else {
		var c *dedupq.Consumer
		if c, err = dedupq.OpenConsumer(t.Context(), raw, dedupq.ConsumerOptions{}); err == nil {
			c.Close(t.Context())
		}
	}
	var pe *dedupq.ParamError
	if !errors.As(err, &pe) {
		t.Fatalf("%q: error %v, want a *dedupq.ParamError", raw, err)
	}
	if s := showsMarker(err); s != "" {
		t.Errorf("%q: the error shows the planted value: %s", raw, s)
	}
	return pe
}

// TestKnownParamsAreTheVocabulary: each adapter takes exactly the
// parameters internal/urlvocab lists for its scheme, which the hints and
// the README table are made from.
func TestKnownParamsAreTheVocabulary(t *testing.T) {
	for _, sch := range schemes(t, refusingAddr(t)) {
		t.Run(sch.name, func(t *testing.T) {
			pe := parseErr(t, sch, sch.base+"&colour="+marker)
			_, list, ok := strings.Cut(pe.Reason, "(known: ")
			if pe.Param != "colour" || !ok {
				t.Fatalf("error %v, want colour refused with the known list", pe)
			}
			got := slices.Sorted(slices.Values(strings.Split(strings.TrimSuffix(list, ")"), ", ")))
			if want := slices.Sorted(slices.Values(sch.known)); !slices.Equal(got, want) {
				t.Errorf("the adapter takes %v, urlvocab lists %v", got, want)
			}
		})
	}
}

// TestUnknownParamHints: through every adapter, an old or another
// backend's spelling is refused with a hint naming the right parameter.
func TestUnknownParamHints(t *testing.T) {
	type hintCase struct{ scheme, param, hint string }
	cases := []hintCase{
		// Every name an adapter took before the common vocabulary.
		{"mem", "ackwait", "did you mean ack_wait?"},
		{"mem", "maxdeliveries", "did you mean max_deliveries?"},
		{"mem", "duppublish", "did you mean dup_publish?"},
		{"mem", "dupdelivery", "did you mean dup_delivery?"},
		{"mem", "lostack", "did you mean lost_ack?"},
		{"jetstream", "duplicates", "did you mean window? JetStream's Duplicates is window here"},
		{"jetstream", "ackwait", "did you mean ack_wait?"},
		{"jetstream", "maxdeliver", "did you mean max_deliveries? JetStream's MaxDeliver is max_deliveries here"},
		{"jetstream", "maxbatch", "did you mean max_batch?"},
		{"sqs", "visibility_timeout", "did you mean ack_wait? SQS's VisibilityTimeout is ack_wait here"},
		{"sqs", "nack_backoff", "did you mean backoff?"},
		{"servicebus", "lock_duration", "did you mean ack_wait? Service Bus's LockDuration is ack_wait here"},
		{"servicebus", "max_delivery_count", "did you mean max_deliveries? Service Bus's MaxDeliveryCount is max_deliveries here"},
		// Case variants, as the issue reported them.
		{"mem", "Window", "did you mean window?"},
		{"jetstream", "ackWait", "did you mean ack_wait?"},
		{"servicebus", "ack-wait", "did you mean ack_wait?"},
		{"pubsub", "Max_Outstanding", "did you mean max_outstanding?"},
		// Another backend's parameter.
		{"sqs", "durable", "durable is a jetstream parameter; sqs has no such parameter"},
		{"pubsub", "window", "window is a jetstream, mem and servicebus parameter; pubsub has no such parameter"},
		{"pubsub", "max_delivery_count", "max_deliveries is a jetstream, mem, servicebus and sqs parameter; pubsub has no such parameter; Service Bus's MaxDeliveryCount is max_deliveries in dedupq URLs"},
		{"pubsub", "ack_extension", "did you mean ack_wait? pubsub's former ack_extension is ack_wait here"},
	}
	// And every parameter of every scheme, on every scheme that lacks it,
	// and in upper case on every scheme that has it.
	all := schemes(t, refusingAddr(t))
	for _, from := range all {
		for _, p := range from.known {
			for _, on := range all {
				if slices.Contains(on.known, p) {
					cases = append(cases, hintCase{on.name, strings.ToUpper(p), "did you mean " + p + "?"})
				} else {
					cases = append(cases, hintCase{on.name, p, p + " is a "})
				}
			}
		}
	}
	byName := map[string]scheme{}
	for _, s := range all {
		byName[s.name] = s
	}
	for _, tc := range cases {
		t.Run(tc.scheme+"/"+tc.param, func(t *testing.T) {
			sch := byName[tc.scheme]
			pe := parseErr(t, sch, sch.base+"&"+tc.param+"="+marker)
			if pe.Param != tc.param || !strings.HasPrefix(pe.Reason, "unknown parameter: ") || !strings.Contains(pe.Reason, tc.hint) {
				t.Errorf("error %v, want %s refused as unknown with %q", pe, tc.param, tc.hint)
			}
		})
	}
}

// TestREADMEListsEveryParameter: README.md's parameter table has a row for
// every parameter of every scheme, portable ones (taken by more than one
// scheme) first, and a scheme's cell is "–" exactly when the scheme does
// not take the parameter. It reads ../../README.md.
func TestREADMEListsEveryParameter(t *testing.T) {
	text, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	cells := func(line string) []string {
		parts := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		for i, p := range parts {
			parts[i] = strings.Trim(strings.TrimSpace(p), "`")
		}
		return parts
	}
	const head = "| parameter | meaning |"
	i := strings.Index(string(text), "\n"+head)
	if i < 0 {
		t.Fatalf("README.md has no table headed %q", head)
	}
	lines := strings.Split(string(text[i+1:]), "\n")
	column := map[string]int{}
	for i, h := range cells(lines[0]) {
		column[strings.TrimSuffix(h, "://")] = i
	}
	rows := map[string][]string{}
	var order []string
	for _, line := range lines[2:] { // after the header and its --- line
		if !strings.HasPrefix(line, "|") {
			break
		}
		c := cells(line)
		rows[c[0]] = c
		order = append(order, c[0])
	}
	all := schemes(t, refusingAddr(t))
	takers := map[string][]string{}
	for _, s := range all {
		if _, ok := column[s.name]; !ok {
			t.Errorf("the table has no column for %s://", s.name)
		}
		for _, p := range s.known {
			takers[p] = append(takers[p], s.name)
		}
	}
	for p := range takers {
		if rows[p] == nil {
			t.Errorf("the table has no row for %s", p)
		}
	}
	seenSpecific := false
	for _, p := range order {
		if takers[p] == nil {
			t.Errorf("the table lists %s, which no scheme takes", p)
			continue
		}
		if portable := len(takers[p]) > 1; portable && seenSpecific {
			t.Errorf("portable parameter %s comes after a scheme's own", p)
		} else if !portable {
			seenSpecific = true
		}
		for _, s := range all {
			i := column[s.name]
			if i >= len(rows[p]) {
				t.Errorf("row %s has no cell for %s", p, s.name)
				continue
			}
			takes := slices.Contains(takers[p], s.name)
			switch cell := rows[p][i]; {
			case takes && cell == "–":
				t.Errorf("row %s, column %s: –, but %s takes %s: name the setting it maps to", p, s.name, s.name, p)
			case !takes && cell != "–":
				t.Errorf("row %s, column %s: %q, but %s does not take %s: want –", p, s.name, cell, s.name, p)
			}
		}
	}
}
