// Runs the benchmark program in quick mode, so that CI keeps it compiling
// and working: the in-memory broker and store (no server), SQS on fauxqs
// and Pub/Sub on pstest. Quick mode measures nothing; the tests check that
// every row ran and printed.
//
// fauxqs needs node (and npm for its first install): where it cannot run
// the SQS check skips with the reason, except under CI (the environment
// variable CI set), where it fails, as the adapters' own tests do.
package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

func TestMain(m *testing.M) {
	// startPstest re-executes this binary to serve pstest.
	if os.Getenv(pstestChildEnv) != "" {
		servePstest()
		return
	}
	os.Exit(m.Run())
}

func TestQuick(t *testing.T) {
	cases := []struct {
		groups string
		want   []string
	}{
		{"mem,memstore", []string{
			"| mem | publish 1 KiB | 1 | driver SendBatch |",
			"| mem | consume+guard | 64 | driver Receive+Ack |",
			"| memstore | claim+complete | 64 | map set-if-absent |",
		}},
		{"jskv", []string{
			"| jskv | claim+complete | 1 | KV Create+Update |",
			"| jskv | claim+complete | 64 | KV Create+Update |",
		}},
		{"sqs", []string{
			"| sqs | publish 1 KiB | 1 | SendMessageBatch |",
			"| sqs | consume | 64 | ReceiveMessage+DeleteMessageBatch |",
			"| sqs | consume+guard | 64 | ReceiveMessage+DeleteMessageBatch |",
		}},
		{"pubsub", []string{
			"| pubsub | publish 1 KiB | 1 | Publisher.Publish |",
			"| pubsub | consume | 64 | Subscriber.Receive+Ack |",
			"| pubsub | consume+guard | 64 | Subscriber.Receive+Ack |",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.groups, func(t *testing.T) {
			var out bytes.Buffer
			if err := run(context.Background(), []string{"-quick", "-only", tc.groups}, &out); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			if _, why, ok := strings.Cut(out.String(), "\nSkipped: "); ok {
				if os.Getenv("CI") != "" {
					t.Fatalf("CI is set but a group cannot run here: %s", why)
				}
				t.Skipf("a group cannot run here: %s", why)
			}
			for _, want := range append(tc.want, "Machine: ", "| raw allocs/msg |") {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

func TestUnknownGroup(t *testing.T) {
	err := run(context.Background(), []string{"-only", "nope"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), `unknown group "nope"`) {
		t.Fatalf("got %v, want an unknown group error", err)
	}
}
