// Talks to: nothing; the tables and Hint only. The check against the
// adapters themselves is in internal/urltest.
package urlvocab

import (
	"slices"
	"strings"
	"testing"
)

func TestHint(t *testing.T) {
	tests := []struct {
		name, scheme, param string
		// want is the whole hint; "" means none.
		want string
	}{
		// The names dedupq used before this vocabulary, on the scheme that
		// used them.
		{"jetstream's old duplicates", "jetstream", "duplicates", "did you mean window? JetStream's Duplicates is window here"},
		{"jetstream's old ackwait", "jetstream", "ackwait", "did you mean ack_wait? parameter names are lower-case snake_case"},
		{"jetstream's old maxdeliver", "jetstream", "maxdeliver", "did you mean max_deliveries? JetStream's MaxDeliver is max_deliveries here"},
		{"jetstream's old maxbatch", "jetstream", "maxbatch", "did you mean max_batch? parameter names are lower-case snake_case"},
		{"mem's old ackwait", "mem", "ackwait", "did you mean ack_wait? parameter names are lower-case snake_case"},
		{"mem's old maxdeliveries", "mem", "maxdeliveries", "did you mean max_deliveries? parameter names are lower-case snake_case"},
		{"mem's old duppublish", "mem", "duppublish", "did you mean dup_publish? parameter names are lower-case snake_case"},
		{"mem's old dupdelivery", "mem", "dupdelivery", "did you mean dup_delivery? parameter names are lower-case snake_case"},
		{"mem's old lostack", "mem", "lostack", "did you mean lost_ack? parameter names are lower-case snake_case"},
		{"sqs's old visibility_timeout", "sqs", "visibility_timeout", "did you mean ack_wait? SQS's VisibilityTimeout is ack_wait here"},
		{"sqs's old nack_backoff", "sqs", "nack_backoff", "did you mean backoff? sqs's former nack_backoff is backoff here"},
		{"servicebus's old lock_duration", "servicebus", "lock_duration", "did you mean ack_wait? Service Bus's LockDuration is ack_wait here"},
		{"servicebus's old max_delivery_count", "servicebus", "max_delivery_count", "did you mean max_deliveries? Service Bus's MaxDeliveryCount is max_deliveries here"},
		// Another broker's name for a setting, on a scheme that has it.
		{"SQS's name on mem", "mem", "visibility_timeout", "did you mean ack_wait? SQS's VisibilityTimeout is ack_wait here"},
		{"Service Bus's name on jetstream", "jetstream", "MaxDeliveryCount", "did you mean max_deliveries? Service Bus's MaxDeliveryCount is max_deliveries here"},
		{"SQS's redrive name", "servicebus", "maxReceiveCount", "did you mean max_deliveries? SQS's maxReceiveCount is max_deliveries here"},
		// Case and separator variants.
		{"capitalized", "mem", "Window", "did you mean window? parameter names are lower-case snake_case"},
		{"camel case", "sqs", "ackWait", "did you mean ack_wait? parameter names are lower-case snake_case"},
		{"kebab case", "servicebus", "ack-wait", "did you mean ack_wait? parameter names are lower-case snake_case"},
		{"upper snake case", "jetstream", "MAX_DELIVERIES", "did you mean max_deliveries? parameter names are lower-case snake_case"},
		{"dotted", "sqs", "hash.long.ids", "did you mean hash_long_ids? parameter names are lower-case snake_case"},
		// Another backend's parameter.
		{"jetstream's durable on sqs", "sqs", "durable", "durable is a jetstream parameter; sqs has no such parameter"},
		{"a variant of it", "sqs", "Durable", "durable is a jetstream parameter; sqs has no such parameter"},
		{"a portable one a backend lacks", "sqs", "window", "window is a jetstream, mem and servicebus parameter; sqs has no such parameter"},
		{"an old name a backend lacks", "pubsub", "maxdeliveries", "max_deliveries is a jetstream, mem, servicebus and sqs parameter; pubsub has no such parameter"},
		{"a broker's name a backend lacks", "pubsub", "max_delivery_count",
			"max_deliveries is a jetstream, mem, servicebus and sqs parameter; pubsub has no such parameter; Service Bus's MaxDeliveryCount is max_deliveries in dedupq URLs"},
		{"a broker's name for a backend's own", "pubsub", "visibility_timeout", "did you mean ack_wait? SQS's VisibilityTimeout is ack_wait here"},
		{"a scheme of another module", "kafka", "region", "region is a sqs parameter; kafka has no such parameter"},
		{"a scheme not to show", "Not A Scheme", "region", "region is a sqs parameter; this scheme has no such parameter"},
		// Nothing to say.
		{"unrelated", "mem", "colour", ""},
		{"empty", "mem", "", ""},
		{"separators only", "mem", "_-.", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			known := Params(tc.scheme)
			if got := Hint(tc.scheme, tc.param, known); got != tc.want {
				t.Errorf("Hint(%q, %q) = %q, want %q", tc.scheme, tc.param, got, tc.want)
			}
		})
	}
}

// TestEveryRenameHasATarget: every entry of renamed leads to a name some
// scheme takes, and differs from it in more than case and separators (those
// need no entry).
func TestEveryRenameHasATarget(t *testing.T) {
	for from, r := range renamed {
		if len(takes(r.name)) == 0 {
			t.Errorf("renamed[%q] = %q, which no scheme takes", from, r.name)
		}
		if normalize(from) != from {
			t.Errorf("renamed key %q is not normalized", from)
		}
		if normalize(r.name) == from {
			t.Errorf("renamed[%q] only folds case and separators; drop it", from)
		}
		if vocabularyName(from) != "" {
			t.Errorf("renamed[%q]: %q is a parameter of some scheme", from, from)
		}
	}
}

// TestNamesFollowTheConvention: lower-case snake_case, and no two
// parameters of one scheme, nor of the whole vocabulary, fold to the same
// name.
func TestNamesFollowTheConvention(t *testing.T) {
	folded := map[string]string{}
	for _, s := range Schemes() {
		ps := Params(s)
		for _, p := range ps {
			if p != strings.ToLower(p) || strings.ContainsAny(p, "-. ") || strings.HasPrefix(p, "_") || strings.HasSuffix(p, "_") {
				t.Errorf("%s parameter %q is not lower-case snake_case", s, p)
			}
			if q, ok := folded[normalize(p)]; ok && q != p {
				t.Errorf("%q and %q fold to the same name", p, q)
			}
			folded[normalize(p)] = p
		}
		if len(slices.Compact(slices.Sorted(slices.Values(ps)))) != len(ps) {
			t.Errorf("%s lists a parameter twice: %v", s, ps)
		}
	}
}

// TestParamsIsACopy: a caller cannot change the table.
func TestParamsIsACopy(t *testing.T) {
	p := Params("mem")
	p[0] = "changed"
	if Params("mem")[0] == "changed" {
		t.Error("Params returned the table itself")
	}
}

// FuzzHintShowsNoInput: whatever name a URL carries, the hint names only
// parameters of the tables and of known, never the name itself.
func FuzzHintShowsNoInput(f *testing.F) {
	for _, s := range []string{"Window", "visibility_timeout", "durable", "x", "ack-wait"} {
		f.Add("sqs", s)
	}
	f.Fuzz(func(t *testing.T, scheme, name string) {
		const marker = "zq9secret"
		if strings.Contains(strings.ToLower(scheme), marker) {
			return
		}
		if h := Hint(scheme, name+marker, Params(scheme)); strings.Contains(strings.ToLower(h), marker) {
			t.Fatalf("Hint(%q, %q) = %q shows the name", scheme, name+marker, h)
		}
	})
}

// TestShown: the values of each kind that are shown, and those that are
// not because they fail the kind's check.
func TestShown(t *testing.T) {
	tests := []struct {
		scheme, name, value string
		want                bool
	}{
		{"jetstream", "window", "2m", true},
		{"jetstream", "window", "2 m", false},
		{"jetstream", "ack_wait", "1h2m3.5s", true},
		{"jetstream", "backoff", "1s,10s,1m", true},
		{"jetstream", "backoff", "1s, 10s", false},
		{"jetstream", "backoff", "1s,,10s", false},
		{"jetstream", "max_deliveries", "-1", true},
		{"jetstream", "max_deliveries", "5x", false},
		{"jetstream", "max_batch", "123456789012345678901", false},
		{"jetstream", "create", "true", true},
		{"jetstream", "create", "yes", false},
		{"jetstream", "storage", "memory", true},
		{"jetstream", "storage", "Memory", false},
		{"jetstream", "subject", "orders.eu_1.x-y", true},
		{"jetstream", "subject", "orders..x", false},
		{"jetstream", "subject", "orders.*", false},
		{"jetstream", "durable", "worker-1", true},
		{"jetstream", "durable", "worker.1", false},
		{"jetstream", "durable", strings.Repeat("w", 256), false},
		{"mem", "dup_publish", "0.25", true},
		{"mem", "dup_publish", "1.5", false},
		{"mem", "lost_ack", "0x1p-2", false},
		{"mem", "seed", "18446744073709551615", true},
		{"sqs", "region", "us-gov-west-1", true},
		{"sqs", "region", "localhost", false},
		{"sqs", "terminate", "dlq", true},
		{"sqs", "group", "orders_eu", true},
		{"sqs", "group", "a:b", false},
		{"servicebus", "window", "none", true},
		{"servicebus", "kind", "topic", true},
		{"servicebus", "max_message_bytes", "1024", true},
		// Whatever may carry a secret, whatever its value.
		{"sqs", "endpoint", "http://127.0.0.1:4566", false},
		{"sqs", "endpoint", "1s", false},
		{"servicebus", "conn_env", "SB_CONN", false},
		{"pubsub", "emulator", "127.0.0.1:8085", false},
		// Not the scheme's, or not of this module.
		{"sqs", "durable", "worker", false},
		{"kafka", "window", "2m", false},
		{"jetstream", "Window", "2m", false},
	}
	for _, tc := range tests {
		if got := Shown(tc.scheme, tc.name, tc.value); got != tc.want {
			t.Errorf("Shown(%q, %q, %q) = %v, want %v", tc.scheme, tc.name, tc.value, got, tc.want)
		}
	}
}

// TestShownNeverSecretShapes: the shapes secrets come in (base64 keys,
// AWS secret keys, connection strings, URLs with credentials, key=value
// pairs, %-escapes) are shown as the value of no parameter of any scheme.
func TestShownNeverSecretShapes(t *testing.T) {
	for _, v := range []string{
		"abc+def/ghi=", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "Zm9vYmFy==",
		"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=s",
		"http://user:pw@h:1/p", "nats://tok@h", "key=value", "a%2Bb", "s3cr3t!", "pass word", "",
	} {
		for _, scheme := range Schemes() {
			for _, p := range Params(scheme) {
				if Shown(scheme, p, v) {
					t.Errorf("Shown(%q, %q, %q) = true", scheme, p, v)
				}
			}
		}
	}
}
