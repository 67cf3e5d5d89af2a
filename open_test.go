// Opening backends from URLs, over the in-memory broker: no services.
package dedupq_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/window"
)

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		url   string
		check func(error) bool
	}{
		{"kafka://broker/orders", func(err error) bool {
			return errors.Is(err, dedupq.ErrUnknownScheme) && strings.Contains(err.Error(), "mem")
		}},
		{"orders", func(err error) bool { return err != nil && strings.Contains(err.Error(), "no scheme") }},
		{"mem://%zz", func(err error) bool { return err != nil && strings.Contains(err.Error(), "malformed URL") }},
		{"mem://open-errors?window=soon", func(err error) bool {
			var pe *dedupq.ParamError
			return errors.As(err, &pe) && pe.Param == "window"
		}},
		{"mem://open-errors?colour=blue", func(err error) bool {
			var pe *dedupq.ParamError
			return errors.As(err, &pe) && pe.Param == "colour"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			_, err := dedupq.OpenPublisher(ctx, tt.url, dedupq.PublisherOptions{})
			if !tt.check(err) {
				t.Errorf("OpenPublisher(%q) = %v", tt.url, err)
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	tests := []struct{ raw, want string }{
		{"mem://orders", "mem://orders"},
		{"jetstream://127.0.0.1:4222/ORDERS?subject=orders&durable=", "jetstream://127.0.0.1:4222/ORDERS?subject=orders&durable="},
		{"servicebus://ns.servicebus.windows.net/q?SharedAccessKey=abc%2Bdef&window=2m", "servicebus://ns.servicebus.windows.net/q?SharedAccessKey=REDACTED&window=2m"},
		{"sqs://q.fifo?aws_secret_access_key=wJalrXUtnFEMI", "sqs://q.fifo?aws_secret_access_key=REDACTED"},
		{"jetstream://s3cr3tToken@h:4222/S", "jetstream://REDACTED@h:4222/S"},
		{"jetstream://user:s3cr3t@h/S", "jetstream://REDACTED@h/S"},
		{"mem://q#s3cr3t", "mem://q#REDACTED"},
		{"mem://q?s3cr3t+value", "mem://q?REDACTED"},
		{"mem://q?s3cr3t&window=", "mem://q?REDACTED&window="},
		{"mem://q?a%3Db=c", "mem://q?REDACTED=REDACTED"},
		{"mem://q?x=%zz&y=1;z=2", "mem://q?x=REDACTED&y=REDACTED"},
		{"servicebus://ns/;SharedAccessKey=s3cr3t", "servicebus://ns/REDACTED"},
		{"servicebus://ns;SharedAccessKey=s3cr3t/q", "servicebus://REDACTED/q"},
		{"mem:opaque?k=v", "mem:opaque?k=REDACTED"},
		{"orders?token=s3cr3t", "orders?token=REDACTED"},
		{"jetstream://[fe80::1%25eth0]:4222/S", "jetstream://[fe80::1%eth0]:4222/S"},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			u, err := url.Parse(tt.raw)
			if err != nil {
				t.Fatal(err)
			}
			if got := dedupq.RedactURL(u); got != tt.want {
				t.Errorf("RedactURL = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestRedactURLShowsHarmlessValues (issue 23, section 3): a user reads
// back the values of the known vocabulary that are checked to be
// harmless, and nothing else: not a credential, an unknown parameter, an
// endpoint, a variable's name, nor a value that fails its kind's check.
func TestRedactURLShowsHarmlessValues(t *testing.T) {
	tests := []struct{ raw, want string }{
		// The issue's own example, and every kind of harmless value.
		{"jetstream://embedded/ORDERS?subject=orders&durable=worker&create=true&max_deliveries=5",
			"jetstream://embedded/ORDERS?subject=orders&durable=worker&create=true&max_deliveries=5"},
		{"jetstream://h/S?subject=orders.eu-1&storage=memory&window=2m&ack_wait=1.5s&backoff=1s,10s&max_batch=100&max_deliveries=-1",
			"jetstream://h/S?subject=orders.eu-1&storage=memory&window=2m&ack_wait=1.5s&backoff=1s,10s&max_batch=100&max_deliveries=-1"},
		{"mem://q?window=0&seed=42&dup_publish=0.1&lost_ack=1e-3", "mem://q?window=0&seed=42&dup_publish=0.1&lost_ack=1e-3"},
		{"sqs://q.fifo?region=eu-west-1&terminate=delete&hash_long_ids=false&group=g_1&wait_time=20s&delete_linger=5ms",
			"sqs://q.fifo?region=eu-west-1&terminate=delete&hash_long_ids=false&group=g_1&wait_time=20s&delete_linger=5ms"},
		{"servicebus://ns/q?window=none&kind=queue&max_message_bytes=1024", "servicebus://ns/q?window=none&kind=queue&max_message_bytes=1024"},
		{"pubsub://p/t?publish_timeout=1m&max_extension=1h&max_outstanding=10", "pubsub://p/t?publish_timeout=1m&max_extension=1h&max_outstanding=10"},
		// What may carry a secret: always hidden.
		{"sqs://q.fifo?endpoint=http://127.0.0.1:4566", "sqs://q.fifo?endpoint=REDACTED"},
		{"servicebus://ns/q?conn_env=SB_CONN", "servicebus://ns/q?conn_env=REDACTED"},
		{"pubsub://p/t?emulator=127.0.0.1:8085", "pubsub://p/t?emulator=REDACTED"},
		{"jetstream://h/S?token=abc&colour=blue", "jetstream://h/S?token=REDACTED&colour=REDACTED"},
		// A parameter of another scheme, or of no scheme of this module.
		{"sqs://q.fifo?durable=worker", "sqs://q.fifo?durable=REDACTED"},
		{"kafka://h/t?window=2m", "kafka://h/t?window=REDACTED"},
		// A value that fails its kind's check, as a secret pasted there does.
		{"jetstream://h/S?durable=s3cr3t%2Bkey%3D&subject=a/b", "jetstream://h/S?durable=REDACTED&subject=REDACTED"},
		{"jetstream://h/S?durable=w.x&subject=a..b&storage=disk", "jetstream://h/S?durable=REDACTED&subject=REDACTED&storage=REDACTED"},
		{"jetstream://h/S?window=2m%20&ack_wait=soon&max_deliveries=5x&create=yes&backoff=1s,,2s",
			"jetstream://h/S?window=REDACTED&ack_wait=REDACTED&max_deliveries=REDACTED&create=REDACTED&backoff=REDACTED"},
		{"mem://q?dup_publish=2&seed=0x10&lost_ack=NaN", "mem://q?dup_publish=REDACTED&seed=REDACTED&lost_ack=REDACTED"},
		{"sqs://q.fifo?region=s3cr3t&group=a%2Bb", "sqs://q.fifo?region=REDACTED&group=REDACTED"},
		{"jetstream://h/S?Durable=worker", "jetstream://h/S?Durable=REDACTED"},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			u, err := url.Parse(tt.raw)
			if err != nil {
				t.Fatal(err)
			}
			if got := dedupq.RedactURL(u); got != tt.want {
				t.Errorf("RedactURL = %q, want %q", got, tt.want)
			}
			// What a ParamError shows of it is the same.
			if got := dedupq.NewParamError(u, "x", "r").Error(); !strings.Contains(got, fmt.Sprintf("%q", tt.want)) {
				t.Errorf("ParamError = %s, want the URL shown as %q", got, tt.want)
			}
		})
	}
}

// TestParamErrorShowsNoSecret: Error redacts again what a ParamError made
// without NewParamError holds.
func TestParamErrorShowsNoSecret(t *testing.T) {
	pe := &dedupq.ParamError{URL: "servicebus://user:pw0rd@ns/q?SharedAccessKey=s3cr3t#fr4g", Param: "k=s3cr3t", Reason: "refused"}
	for _, text := range []string{pe.Error(), fmt.Sprintf("%+v", pe), fmt.Sprintf("%v", error(pe))} {
		for _, secret := range []string{"pw0rd", "s3cr3t", "fr4g", "user"} {
			if strings.Contains(text, secret) {
				t.Errorf("%q shows %q", text, secret)
			}
		}
	}
	u, _ := url.Parse("mem://q?token=s3cr3t")
	if got := dedupq.NewParamError(u, "k=s3cr3t", "r"); got.Param != "query" || strings.Contains(got.URL, "s3cr3t") {
		t.Errorf("NewParamError = %#v, want the value and the odd name hidden", got)
	}
}

// TestOpenErrorsNeverEchoQuery: the mux's own errors (no scheme, a URL
// that does not parse) and the errors of the parameters every adapter
// reads through QueryParams show no value. The cross-adapter test is in
// internal/urltest.
func TestOpenErrorsNeverEchoQuery(t *testing.T) {
	const secret = "Zq9SeCrEt"
	for _, raw := range []string{
		"orders?token=" + secret,
		"mem://h:" + secret + "/x",
		"mem://q?x=%zz" + secret,
		"mem://q?a=1;" + secret + "=2",
		"mem://q?token=" + secret,
		"mem://q?aws_secret_access_key=" + secret,
		"mem://q?colour=" + secret,
		"mem://q?window=" + secret,
		"mem://q?window=" + secret + "&window=1m",
		"mem://q?" + secret,
		"mem://q?%zz" + secret + "=1",
		"mem://user:" + secret + "@q?window=soon#" + secret,
		"mem://q/;token=" + secret,
		"mem://q;token=" + secret + "/",
		"%zz" + secret + "://x",
		"mem://q\x00" + secret,
	} {
		t.Run(raw, func(t *testing.T) {
			_, err := dedupq.OpenPublisher(context.Background(), raw, dedupq.PublisherOptions{})
			if err == nil {
				t.Fatal("opened")
			}
			for _, text := range []string{err.Error(), fmt.Sprintf("%+v", err)} {
				if strings.Contains(strings.ToLower(text), strings.ToLower(secret)) {
					t.Errorf("error shows the secret: %s", text)
				}
			}
			var pe *dedupq.ParamError
			if errors.As(err, &pe) && strings.Contains(fmt.Sprintf("%#v", pe), secret) {
				t.Errorf("ParamError fields hold the secret: %#v", pe)
			}
		})
	}
}

func TestQueryParams(t *testing.T) {
	known := []string{"window", "group"}
	tests := []struct{ raw, param, reason string }{
		{"x://h?window=1m&group=g", "", ""},
		{"x://h?SharedAccessKey=k", "SharedAccessKey", "credentials never go in a URL: HINT"},
		{"x://h?aws_secret_access_key=k", "aws_secret_access_key", "credentials"},
		{"x://h?Password=k", "Password", "credentials"},
		{"x://h?api-key=k", "api-key", "credentials"},
		{"x://h?colour=blue", "colour", "unknown parameter (known: window, group)"},
		{"x://h?window=1m&window=2m", "window", "given 2 times"},
		{"x://h?=1", "query", "without a name"},
		{"x://h?window=%zz", "query", "%-escape"},
		{"x://h?window=1;group=2", "query", "separated by '&'"},
		{"x://h?window=1&s3cr3t", "query", "without '='"},
		// Several problems: always the first in name order.
		{"x://h?zz=1&aa=1&window=1&window=2", "aa", "unknown"},
		// An unknown name gets a hint naming parameters, never a value.
		{"x://h?Window=1m", "Window", "unknown parameter: did you mean window? parameter names are lower-case snake_case (known: window, group)"},
		{"x://h?duplicates=1m", "duplicates", "did you mean window? JetStream's Duplicates is window here"},
		{"sqs://h?durable=d", "durable", "unknown parameter: durable is a jetstream parameter; sqs has no such parameter (known: window, group)"},
	}
	for _, tt := range tests {
		t.Run(tt.raw, func(t *testing.T) {
			u, err := url.Parse(tt.raw)
			if err != nil {
				t.Fatal(err)
			}
			_, err = dedupq.QueryParams(u, known, "HINT")
			if tt.param == "" {
				if err != nil {
					t.Fatalf("QueryParams: %v", err)
				}
				return
			}
			var pe *dedupq.ParamError
			if !errors.As(err, &pe) || pe.Param != tt.param || !strings.Contains(pe.Reason, tt.reason) {
				t.Fatalf("QueryParams error %v, want a ParamError on %q mentioning %q", err, tt.param, tt.reason)
			}
		})
	}
}

// TestQueryParamsCredentialsBeforeHints: a name that looks like a
// credential is refused as one even when it is a variant of a known name,
// so that the reader is told where credentials go, not how to spell them.
func TestQueryParamsCredentialsBeforeHints(t *testing.T) {
	u, _ := url.Parse("x://h?Token_Env=X")
	_, err := dedupq.QueryParams(u, []string{"token_env"}, "HINT")
	var pe *dedupq.ParamError
	if !errors.As(err, &pe) || pe.Param != "Token_Env" || pe.Reason != "credentials never go in a URL: HINT" {
		t.Fatalf("QueryParams error %v, want Token_Env refused as a credential", err)
	}
}

func TestOpenRunsTheStartupCheck(t *testing.T) {
	_, err := dedupq.OpenPublisher(context.Background(), "mem://open-check?window=10s", dedupq.PublisherOptions{})
	if !errors.Is(err, window.ErrUnsafeRetry) {
		t.Fatalf("the default 51.5s policy on a 10s window: %v, want ErrUnsafeRetry", err)
	}
}

// FuzzOpenPublisher: any string either opens a publisher or fails with an
// error; it never panics.
func FuzzOpenPublisher(f *testing.F) {
	for _, s := range []string{"mem://q", "mem://q?window=2m&ack_wait=1s", "mem://", "mem:q", "://", "mem://q?backoff=1s,,2s", "mem://q?seed=-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		p, err := dedupq.OpenPublisher(context.Background(), raw, dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 1}})
		if err == nil {
			_ = p.Close(context.Background())
		}
	})
}
