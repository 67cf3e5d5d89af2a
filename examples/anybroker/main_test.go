package main

// Runs the example unchanged on the in-memory broker, on the NATS server
// package embedded runs in this process (the URL host "embedded"), on the local
// NATS server at 127.0.0.1:4222, and on an SQS FIFO queue that create=true
// makes in the fauxqs emulator (localstack/fauxqs) started, and installed
// from its lockfile if needed, by the test. The local server, and fauxqs when node or npm is
// missing, are skipped outside CI and fail the test under CI. Each run's
// output is checked: every effect once where both startup checks pass (the
// default URL among them), the fallback where they refuse, and a second
// run within the window reporting every send as a duplicate the broker
// already stored, without waiting for deliveries.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	"github.com/dedupq/dedupq/examples/internal/need"
)

// deleteStream removes the example's stream from the shared local server.
func deleteStream(server, name string) {
	nc, err := nats.Connect(server)
	if err != nil {
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = js.DeleteStream(ctx, name)
}

// wantOnce fails unless the run's output shows every order's effect
// running exactly once.
func wantOnce(t *testing.T, out string) {
	t.Helper()
	for _, id := range []string{"order-1", "order-2", "order-3"} {
		if want := "effect of " + id + " ran 1 time(s)\n"; !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
}

// wantAllDuplicates fails unless the run's output shows every send
// reported as a duplicate the broker already stored, and nothing waited
// for.
func wantAllDuplicates(t *testing.T, out string) {
	t.Helper()
	if n := strings.Count(out, ": duplicate (already stored)"); n != 4 {
		t.Errorf("%d sends reported as duplicates, want all 4:\n%s", n, out)
	}
	if !strings.Contains(out, "nothing new was stored, so nothing to consume") {
		t.Errorf("a run that stored nothing did not say so:\n%s", out)
	}
}

func TestRunOnEveryBroker(t *testing.T) {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	id := hex.EncodeToString(suffix)
	cases := []struct {
		name  string
		url   string
		local bool
		url2  func(t *testing.T) string // when set, makes the URL
		again bool                      // run a second time, within the window
		check func(t *testing.T, out string)
	}{
		// The first run of a newcomer: the default URL (on a queue of its
		// own: mem queues live as long as the process, and -count reruns).
		// Both checks pass and every effect runs once; the refusal is a
		// step of its own.
		{"default", strings.Replace(defaultURL, "mem://orders?", "mem://orders-"+id+"?", 1), false, nil, false, func(t *testing.T, out string) {
			wantOnce(t, out)
			if !strings.Contains(out, "1. startup check refused retries for") {
				t.Errorf("the refusal step is missing:\n%s", out)
			}
			if strings.Contains(out, "->") {
				t.Errorf("the default run fell back from a refused check:\n%s", out)
			}
		}},
		// No window, unbounded redelivery: both checks refuse and the
		// program falls back, saying so.
		{"mem without window", "mem://example-" + id, false, nil, false, func(t *testing.T, out string) {
			for _, want := range []string{"2. consumer check refused the dedup guard", "3. publisher check refused the default retries", "-> publishing without retries"} {
				if !strings.Contains(out, want) {
					t.Errorf("the output lacks %q:\n%s", want, out)
				}
			}
		}},
		{"mem with window", "mem://example-w-" + id + "?window=2m&max_deliveries=5", false, nil, true, wantOnce},
		// File storage: the stream outlives the server's stop after the
		// first run, so the second finds the first's sends.
		{"jetstream embedded", "jetstream://embedded/EX" + id + "?subject=ex" + id + "&durable=example&create=true&max_deliveries=5", false, nil, true, wantOnce},
		{"jetstream local", "jetstream://127.0.0.1:4222/EX" + id + "?subject=ex" + id + "&durable=example&create=true&max_deliveries=5&storage=memory", true, nil, true, wantOnce},
		// One URL, no queue made by hand: create=true makes the queue, its
		// dead-letter queue and the redrive policy once both checks pass.
		{"sqs fauxqs", "", false, func(t *testing.T) string {
			return "sqs://example-" + id + ".fifo?region=us-east-1&endpoint=" + need.Fauxqs(t) + "&create=true"
		}, false, wantOnce},
	}
	// Removes the store of the server the embedded case started.
	t.Cleanup(func() { _ = embedded.Shutdown(context.Background()) })
	if cases[0].url == defaultURL {
		t.Fatalf("could not give the default URL %s a queue of its own", defaultURL)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.local {
				c, err := net.DialTimeout("tcp", "127.0.0.1:4222", 2*time.Second)
				switch {
				case err == nil:
					c.Close()
					t.Cleanup(func() { deleteStream("nats://127.0.0.1:4222", "EX"+id) })
				case os.Getenv("CI") != "":
					t.Fatalf("the local NATS server is unreachable under CI: %v", err)
				default:
					t.Skipf("the local NATS server at 127.0.0.1:4222 is unreachable (%v); skipping outside CI", err)
				}
			}
			url := tc.url
			if tc.url2 != nil {
				url = tc.url2(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out strings.Builder
			if err := run(ctx, &out, url); err != nil {
				t.Fatalf("run(%s): %v\n%s", url, err, out.String())
			}
			t.Log("\n" + out.String())
			tc.check(t, out.String())
			if !tc.again {
				return
			}
			// A second run within the window: the broker drops every send,
			// and the run must say so and not wait for deliveries that
			// will not come.
			out.Reset()
			if err := run(ctx, &out, url); err != nil {
				t.Fatalf("second run(%s): %v\n%s", url, err, out.String())
			}
			t.Log("\n" + out.String())
			wantAllDuplicates(t, out.String())
		})
	}
}
