package jetstream

// Pure functions: limits, message mapping, error classification and the
// redelivery policy. These tests talk to no server.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

func TestRedeliveryPolicy(t *testing.T) {
	s := time.Second
	cases := []struct {
		name string
		cfg  jetstream.ConsumerConfig
		want window.RedeliveryPolicy
		span time.Duration
	}{
		{"defaults: unlimited", jetstream.ConsumerConfig{AckWait: 30 * s, MaxDeliver: -1},
			window.RedeliveryPolicy{MaxDeliveries: 0, AckWait: 30 * s}, window.Forever},
		{"ack wait not reported", jetstream.ConsumerConfig{MaxDeliver: 2},
			window.RedeliveryPolicy{MaxDeliveries: 2, AckWait: DefaultAckWait}, 2 * DefaultAckWait},
		{"no backoff", jetstream.ConsumerConfig{AckWait: 10 * s, MaxDeliver: 5},
			window.RedeliveryPolicy{MaxDeliveries: 5, AckWait: 10 * s}, 50 * s},
		// Real schedule 1+5+30+30+30 = 96s; every delivery counted at the
		// longest hold gives 150s.
		{"increasing backoff", jetstream.ConsumerConfig{AckWait: s, MaxDeliver: 5, BackOff: []time.Duration{s, 5 * s, 30 * s}},
			window.RedeliveryPolicy{MaxDeliveries: 5, AckWait: 30 * s}, 150 * s},
		// A backoff shorter than AckWait (servers before BackOff forced
		// AckWait) must not shorten the bound.
		{"backoff below ack wait", jetstream.ConsumerConfig{AckWait: 20 * s, MaxDeliver: 3, BackOff: []time.Duration{s, 2 * s}},
			window.RedeliveryPolicy{MaxDeliveries: 3, AckWait: 20 * s}, 60 * s},
		{"decreasing backoff", jetstream.ConsumerConfig{AckWait: 9 * s, MaxDeliver: 3, BackOff: []time.Duration{9 * s, s}},
			window.RedeliveryPolicy{MaxDeliveries: 3, AckWait: 9 * s}, 27 * s},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := redeliveryPolicy(tc.cfg)
			if got.MaxDeliveries != tc.want.MaxDeliveries || got.AckWait != tc.want.AckWait || len(got.Backoff) != 0 {
				t.Errorf("policy = %v, want %v", got, tc.want)
			}
			if got.Span() != tc.span {
				t.Errorf("span = %s, want %s", got.Span(), tc.span)
			}
			// The span bounds the real worst case: every delivery held
			// for its own hold, nacks redelivering at once.
			if tc.cfg.MaxDeliver > 0 {
				var real time.Duration
				for n := 1; n <= tc.cfg.MaxDeliver; n++ {
					real += hold(tc.cfg, n)
				}
				if real > got.Span() {
					t.Errorf("real schedule %s exceeds the reported span %s", real, got.Span())
				}
			}
		})
	}
}

func TestHold(t *testing.T) {
	s := time.Second
	backoff := jetstream.ConsumerConfig{AckWait: s, BackOff: []time.Duration{s, 5 * s, 30 * s}}
	cases := []struct {
		cfg  jetstream.ConsumerConfig
		n    int
		want time.Duration
	}{
		{jetstream.ConsumerConfig{AckWait: 7 * s}, 1, 7 * s},
		{jetstream.ConsumerConfig{AckWait: 7 * s}, 9, 7 * s},
		{jetstream.ConsumerConfig{}, 1, DefaultAckWait},
		{backoff, 1, s},
		{backoff, 2, 5 * s},
		{backoff, 3, 30 * s},
		{backoff, 10, 30 * s},
		{backoff, 0, s},
	}
	for _, tc := range cases {
		if got := hold(tc.cfg, tc.n); got != tc.want {
			t.Errorf("hold(%v, %d) = %s, want %s", tc.cfg.BackOff, tc.n, got, tc.want)
		}
	}
}

func TestLimits(t *testing.T) {
	lim := limits("ORDERS", 1<<20)
	// The largest message the limits let through, with the longest ID
	// and every attribute, must fit max_payload once framed as headers.
	m := &driver.Message{ID: strings.Repeat("i", lim.MaxIDLength), Attributes: map[string]string{}}
	for i := range lim.MaxAttributes {
		m.Attributes[fmt.Sprintf("k%d", i)] = "v"
	}
	m.Body = make([]byte, lim.MaxMessageBytes-m.Size())
	nm := toNATS("orders", "ORDERS", m)
	// Size counts the subject too; max_payload counts headers and body.
	if n := nm.Size() - len(nm.Subject); n > 1<<20 {
		t.Errorf("a message at MaxMessageBytes is %d bytes on the wire, over max_payload %d", n, 1<<20)
	}
	if lim.MaxMessageBytes < 1<<20-1024 {
		t.Errorf("MaxMessageBytes %d leaves more than 1 KiB of max_payload unused", lim.MaxMessageBytes)
	}
	if got := limits("S", 10).MaxMessageBytes; got != 1 {
		t.Errorf("MaxMessageBytes for a tiny payload = %d, want the floor 1", got)
	}
}

// TestToNATS checks the headers toNATS writes itself, in place of the
// WithMsgID and WithExpectStream publish options: each header has exactly
// its own value, although the values share one backing array.
func TestToNATS(t *testing.T) {
	cases := []struct {
		name    string
		m       driver.Message
		subject string
		want    nats.Header
	}{
		{"plain", driver.Message{ID: "a1", Body: []byte("x")}, "orders",
			nats.Header{jetstream.MsgIDHeader: {"a1"}, jetstream.ExpectedStreamHeader: {"ORDERS"}}},
		{"group and attributes", driver.Message{ID: "b2", GroupKey: "g", Attributes: map[string]string{"k1": "v1", "k2": "v2"}}, "orders.g",
			nats.Header{jetstream.MsgIDHeader: {"b2"}, jetstream.ExpectedStreamHeader: {"ORDERS"}, "k1": {"v1"}, "k2": {"v2"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			nm := toNATS("orders", "ORDERS", &tc.m)
			if nm.Subject != tc.subject || string(nm.Data) != string(tc.m.Body) {
				t.Errorf("subject %q, data %q; want %q, %q", nm.Subject, nm.Data, tc.subject, tc.m.Body)
			}
			// A header added to later must not write over its neighbour.
			nm.Header.Add(jetstream.MsgIDHeader, "extra")
			tc.want[jetstream.MsgIDHeader] = append(tc.want[jetstream.MsgIDHeader], "extra")
			if !reflect.DeepEqual(nm.Header, tc.want) {
				t.Errorf("headers %v, want %v", nm.Header, tc.want)
			}
		})
	}
}

func TestAttributeNames(t *testing.T) {
	cases := map[string]bool{
		"color": true, "X-Trace": true, "n": true, "a_b-c.d": true,
		"": false, "Nats-Msg-Id": false, "nats-expected-stream": false, "NATS-TTL": false,
		"Status": false, "description": false, "has space": false, "a:b": false,
		"é": false, "tab\t": false, "Nats": true, "Natsy-x": true,
	}
	for name, want := range cases {
		if got := attributeNameAllowed(name); got != want {
			t.Errorf("attributeNameAllowed(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestCheckMessage(t *testing.T) {
	ok := func() *driver.Message { return &driver.Message{ID: "id-1", Body: []byte("b")} }
	cases := []struct {
		name string
		edit func(m *driver.Message)
		bad  bool
	}{
		{"valid", func(*driver.Message) {}, false},
		{"group key", func(m *driver.Message) { m.GroupKey = "eu-1" }, false},
		{"attributes", func(m *driver.Message) { m.Attributes = map[string]string{"a": "x y", "b": ""} }, false},
		{"empty ID", func(m *driver.Message) { m.ID = "" }, true},
		{"ID with space", func(m *driver.Message) { m.ID = "a b" }, true},
		{"ID with newline", func(m *driver.Message) { m.ID = "a\nb" }, true},
		{"ID non-ASCII", func(m *driver.Message) { m.ID = "é" }, true},
		{"long ID", func(m *driver.Message) { m.ID = strings.Repeat("a", MaxIDLength+1) }, true},
		{"group key with dot", func(m *driver.Message) { m.GroupKey = "a.b" }, true},
		{"group key wildcard", func(m *driver.Message) { m.GroupKey = "*" }, true},
		{"reserved attribute", func(m *driver.Message) { m.Attributes = map[string]string{"Nats-Msg-Id": "x"} }, true},
		{"value with CRLF", func(m *driver.Message) { m.Attributes = map[string]string{"a": "x\r\nNats-Rollup: all"} }, true},
		{"value with leading space", func(m *driver.Message) { m.Attributes = map[string]string{"a": " x"} }, true},
		{"value with trailing tab", func(m *driver.Message) { m.Attributes = map[string]string{"a": "x\t"} }, true},
	}
	for _, tc := range cases {
		m := ok()
		tc.edit(m)
		err := checkMessage(m)
		if (err != nil) != tc.bad {
			t.Errorf("%s: checkMessage = %v, want error %v", tc.name, err, tc.bad)
		}
		if err != nil && isRetryable(err) {
			t.Errorf("%s: a refused message is reported retryable", tc.name)
		}
	}
}

func TestCovers(t *testing.T) {
	cases := []struct {
		patterns []string
		subject  string
		want     bool
	}{
		{[]string{"orders", "orders.>"}, "orders", true},
		{[]string{"orders", "orders.>"}, "orders.*", true},
		{[]string{"orders.*"}, "orders.*", true},
		{[]string{">"}, "orders.*", true},
		{[]string{"*"}, "orders", true},
		{[]string{"*.*"}, "orders.*", true},
		{[]string{"orders.>"}, "orders", false},
		{[]string{"orders"}, "orders.*", false},
		{[]string{"orders.eu"}, "orders.*", false},
		{[]string{"orders.*.x"}, "orders.*", false},
		{[]string{"other.>"}, "orders.*", false},
		{nil, "orders", false},
	}
	for _, tc := range cases {
		if got := covers(tc.patterns, tc.subject); got != tc.want {
			t.Errorf("covers(%v, %q) = %v, want %v", tc.patterns, tc.subject, got, tc.want)
		}
	}
}

func TestIsRetryable(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{context.DeadlineExceeded, true},
		{fmt.Errorf("wrapped: %w", context.Canceled), true},
		{nats.ErrTimeout, true},
		{nats.ErrNoResponders, true},
		{jetstream.ErrNoStreamResponse, true},
		{jetstream.ErrAsyncPublishTimeout, true},
		{jetstream.ErrTooManyStalledMsgs, true},
		{nats.ErrDisconnected, true},
		{nats.ErrReconnectBufExceeded, true},
		{nats.ErrConnectionReconnecting, true},
		{jetstream.ErrNoHeartbeat, true},
		// What a pull, a publish or an ack meets while the server restarts.
		{fmt.Errorf("jetstream: fetch: %w", jetstream.ErrServerShutdown), true},
		{jetstream.ErrConsumerLeadershipChanged, true},
		{nats.ErrNoServers, true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{jetstream.ErrConsumerDeleted, false},
		{io.EOF, true},
		{&noAnswerError{nats.ErrConnectionClosed}, true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{&jetstream.APIError{Code: 408, Description: "timeout"}, true},
		{fmt.Errorf("jetstream: stream refused the message: %w", &jetstream.APIError{Code: 400, ErrorCode: 10060, Description: "expected stream does not match"}), false},
		{&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamMessageExceedsMaximum}, false},
		{jetstream.ErrStreamNotFound, false},
		{jetstream.ErrConsumerNotFound, false},
		{jetstream.ErrMsgAlreadyAckd, false},
		{nats.ErrConnectionClosed, false},
		{nats.ErrMaxPayload, false},
		{nats.ErrBadHeaderMsg, false},
		{&refusedError{"x"}, false},
		// 409s for a durable's request limits, as the client renders them.
		{fmt.Errorf("jetstream: fetch: %w", asPullLimit(errors.New("nats: Exceeded MaxWaiting"))), true},
		{asPullLimit(errors.New("nats: Exceeded MaxRequestExpires of 1s")), true},
		{asPullLimit(errors.New("nats: Exceeded MaxRequestBatch of 10")), true},
		{asPullLimit(errors.New("nats: Exceeded something else")), false},
		{&DurableError{Stream: "S", Durable: "D", Problems: []string{"x"}}, false},
		{errors.New("something else"), false},
	}
	for _, tc := range cases {
		if got := isRetryable(tc.err); got != tc.want {
			t.Errorf("isRetryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestServerAtLeast(t *testing.T) {
	cases := []struct {
		v    string
		want bool
	}{
		{"2.10.4", true}, {"2.10.5", true}, {"2.11.0", true}, {"3.0.0", true}, {"2.15.2-beta.1", true},
		{"2.10.3", false}, {"2.9.10", false}, {"1.99.99", false}, {"", false}, {"2.10", false}, {"x.y.z", false},
	}
	for _, tc := range cases {
		if got := serverAtLeast(tc.v, 2, 10, 4); got != tc.want {
			t.Errorf("serverAtLeast(%q, 2.10.4) = %v, want %v", tc.v, got, tc.want)
		}
	}
}

func TestLimitsCheckRefusesHeaderValues(t *testing.T) {
	check := limits("ORDERS", 1<<20).Check
	for _, tc := range []struct {
		value string
		ok    bool
	}{
		{"plain value", true},
		{"a\r\nInjected: header", false},
		{" padded", false},
		{"tab\t", false},
	} {
		field, err := check(&driver.Message{ID: "a", Attributes: map[string]string{"k": tc.value}})
		if tc.ok != (err == nil) || (err != nil && field != "Attributes") {
			t.Errorf("Check(%q) = %q, %v; want ok=%v", tc.value, field, err, tc.ok)
		}
	}
}
