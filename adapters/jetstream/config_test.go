package jetstream

// URL parsing. These tests talk to no server.

import (
	"errors"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq"
)

func TestParseURL(t *testing.T) {
	cases := []struct {
		raw    string
		server string
		cfg    Config
	}{
		{"jetstream://127.0.0.1:4222/ORDERS?subject=orders", "nats://127.0.0.1:4222",
			Config{Stream: "ORDERS", Subject: "orders"}},
		{"jetstream://nats.example:5000/ORDERS?subject=orders.eu&durable=billing", "nats://nats.example:5000",
			Config{Stream: "ORDERS", Subject: "orders.eu", Durable: "billing"}},
		{"jetstream://localhost/S?subject=s", "nats://localhost:4222", Config{Stream: "S", Subject: "s"}},
		{"jetstream:///S?subject=s", "nats://127.0.0.1:4222", Config{Stream: "S", Subject: "s"}},
		{"jetstream://:4333/S?subject=s", "nats://127.0.0.1:4333", Config{Stream: "S", Subject: "s"}},
		{"jetstream://[::1]:4222/S?subject=s", "nats://[::1]:4222", Config{Stream: "S", Subject: "s"}},
		{"jetstream://u:p@h:1/S?subject=s", "nats://u:p@h:1", Config{Stream: "S", Subject: "s"}},
		{"jetstream://h/S?subject=s&durable=d&create=true&storage=memory&window=5m&ack_wait=10s&max_deliveries=7&backoff=1s,%202s&max_batch=64",
			"nats://h:4222", Config{
				Stream: "S", Subject: "s", Durable: "d", CreateStream: true, Storage: jetstream.MemoryStorage,
				Duplicates: 5 * time.Minute, AckWait: 10 * time.Second, MaxDeliver: 7,
				BackOff: []time.Duration{time.Second, 2 * time.Second}, MaxBatch: 64,
			}},
		{"jetstream://h/S?subject=s&max_deliveries=-1&create=false&storage=file", "nats://h:4222",
			Config{Stream: "S", Subject: "s", MaxDeliver: -1}},
	}
	for _, tc := range cases {
		t.Run(tc.raw, func(t *testing.T) {
			u, err := url.Parse(tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			server, cfg, err := ParseURL(u)
			if err != nil {
				t.Fatalf("ParseURL: %v", err)
			}
			if server != tc.server {
				t.Errorf("server = %q, want %q", server, tc.server)
			}
			if !reflect.DeepEqual(cfg, tc.cfg) {
				t.Errorf("config = %+v, want %+v", cfg, tc.cfg)
			}
		})
	}
}

func TestParseURLErrors(t *testing.T) {
	cases := []struct {
		raw   string
		param string
		// reason is a part of the error's reason.
		reason string
	}{
		{"jetstream://h/S", "subject", "missing"},
		{"jetstream://h/?subject=s", "stream", "missing"},
		{"jetstream://h?subject=s", "stream", "missing"},
		{"jetstream://h/A/B?subject=s", "stream", "one stream name"},
		{"jetstream://h/A.B?subject=s", "stream", "not allowed"},
		{"jetstream://h/A%20B?subject=s", "stream", "not allowed"},
		{"jetstream://h/S?subject=a..b", "subject", "empty"},
		{"jetstream://h/S?subject=a.*", "subject", "wildcard"},
		{"jetstream://h/S?subject=a.>", "subject", "wildcard"},
		{"jetstream://h/S?subject=a%20b", "subject", "not allowed"},
		{"jetstream://h/S?subject=", "subject", "missing"},
		{"jetstream://h/S?subject=s&durable=a.b", "durable", "not allowed"},
		{"jetstream://h/S?subject=s&durable=", "durable", "missing"},
		{"jetstream://h/S?subject=s&create=maybe", "create", "true or false"},
		{"jetstream://h/S?subject=s&storage=disk", "storage", "file or memory"},
		{"jetstream://h/S?subject=s&window=soon", "window", "duration"},
		{"jetstream://h/S?subject=s&window=10ms", "window", "minimum"},
		{"jetstream://h/S?subject=s&ack_wait=-1s", "ack_wait", "minimum"},
		{"jetstream://h/S?subject=s&max_deliveries=0", "max_deliveries", "positive"},
		{"jetstream://h/S?subject=s&max_deliveries=-2", "max_deliveries", "positive"},
		{"jetstream://h/S?subject=s&max_deliveries=x", "max_deliveries", "positive"},
		{"jetstream://h/S?subject=s&backoff=1s,,2s", "backoff", "positive durations"},
		{"jetstream://h/S?subject=s&backoff=0s", "backoff", "positive durations"},
		{"jetstream://h/S?subject=s&backoff=1s,2s,3s&max_deliveries=2", "backoff", "deliveries"},
		{"jetstream://h/S?subject=s&max_batch=0", "max_batch", "positive"},
		{"jetstream://h/S?subject=s&durble=x", "durble", "unknown parameter"},
		{"jetstream://h/S?subject=s&subject=t", "subject", "2 times"},
		{"jetstream://h:0/S?subject=s", "host", "port"},
		{"jetstream://h:99999/S?subject=s", "host", "port"},
		{"jetstream://h:/S?subject=s", "host", "empty port"},
		{"jetstream://a:1,b:2/S?subject=s", "host", "one server"},
		{"jetstream:S?subject=s", "host", "host:port"},
		{"jetstream://h;token=x/S?subject=s", "host", "host name"},
		{"jetstream://h/S?subject=s&token=x", "token", "credentials never go in a URL"},
		{"jetstream://h/S?subject=s#frag", "fragment", "fragment"},
		{"jetstream://h/S?subject=s&%zz", "query", "malformed"},
		{"nats://h/S?subject=s", "scheme", "jetstream"},
	}
	for _, tc := range cases {
		t.Run(tc.raw, func(t *testing.T) {
			u, err := url.Parse(tc.raw)
			if err != nil {
				t.Fatalf("url.Parse: %v (the case needs a URL that parses)", err)
			}
			_, _, err = ParseURL(u)
			var pe *dedupq.ParamError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v: want a *dedupq.ParamError", err)
			}
			if pe.Param != tc.param || !strings.Contains(pe.Reason, tc.reason) {
				t.Errorf("ParamError{Param: %q, Reason: %q}, want Param %q and a reason mentioning %q", pe.Param, pe.Reason, tc.param, tc.reason)
			}
			if pe.URL == "" {
				t.Errorf("ParamError names no URL")
			}
		})
	}
}

func TestParseURLRedactsPassword(t *testing.T) {
	for _, raw := range []string{"jetstream://user:secret@h/S", "jetstream://secret@h/S", "jetstream://h/S?subject=s&storage=secret"} {
		u, _ := url.Parse(raw)
		_, _, err := ParseURL(u)
		if err == nil || strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: error %v: want an error that does not show the secret", raw, err)
		}
	}
}

func TestConfigURLRoundTrip(t *testing.T) {
	cases := []struct {
		server string
		cfg    Config
	}{
		{"127.0.0.1:4222", Config{Stream: "S", Subject: "s"}},
		{"nats://127.0.0.1:41234", Config{Stream: "ORDERS", Subject: "orders.eu", Durable: "billing", CreateStream: true}},
		{"nats://u:p%40ss@h:1", Config{
			Stream: "S", Subject: "s", Storage: jetstream.MemoryStorage, Duplicates: 1500 * time.Millisecond,
			AckWait: time.Second, MaxDeliver: -1, BackOff: []time.Duration{time.Second, time.Minute}, MaxBatch: 3,
		}},
	}
	for _, tc := range cases {
		raw := tc.cfg.URL(tc.server)
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		_, got, err := ParseURL(u)
		if err != nil {
			t.Fatalf("ParseURL(%s): %v", raw, err)
		}
		if !reflect.DeepEqual(got, tc.cfg) {
			t.Errorf("ParseURL(%s) = %+v, want %+v", raw, got, tc.cfg)
		}
	}
}

// FuzzParseURL checks that the parser never panics, that every error is a
// *dedupq.ParamError, and that whatever it accepts is a valid Config that
// survives a round trip through Config.URL.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"jetstream://127.0.0.1:4222/ORDERS?subject=orders&durable=billing",
		"jetstream:///S?subject=a.b.c&create=true&window=2m&ack_wait=30s&max_deliveries=5&backoff=1s,5s",
		"jetstream://u:p@[::1]:1/S?subject=s&storage=memory&max_batch=9",
		"jetstream://h/S?subject=s&max_deliveries=-1",
		"jetstream://h:/S?subject=",
		"jetstream:S",
		"jetstream://h/S?subject=%2A",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		server, cfg, err := ParseURL(u)
		if err != nil {
			var pe *dedupq.ParamError
			if !errors.As(err, &pe) || pe.Param == "" {
				t.Fatalf("ParseURL(%q) error %v: want a *dedupq.ParamError naming a parameter", raw, err)
			}
			return
		}
		if u.Scheme != Scheme {
			t.Fatalf("ParseURL(%q) accepted scheme %q", raw, u.Scheme)
		}
		if err := cfg.validate(false); err != nil {
			t.Fatalf("ParseURL(%q) returned an invalid config %+v: %v", raw, cfg, err)
		}
		if _, err := url.Parse(server); err != nil {
			t.Fatalf("ParseURL(%q) returned server %q that does not parse: %v", raw, server, err)
		}
		again, err := url.Parse(cfg.URL(server))
		if err != nil {
			t.Fatalf("Config.URL(%q) of %+v does not parse: %v", server, cfg, err)
		}
		server2, cfg2, err := ParseURL(again)
		if err != nil {
			t.Fatalf("round trip of %q via %q: %v", raw, again, err)
		}
		if server2 != server || !reflect.DeepEqual(cfg2, cfg) {
			t.Fatalf("round trip of %q: got %q %+v, want %q %+v", raw, server2, cfg2, server, cfg)
		}
	})
}
