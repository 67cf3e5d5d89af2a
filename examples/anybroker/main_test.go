package main

// Runs the example unchanged on the in-memory broker, on an embedded NATS
// server started in this process (the URL host "embedded"), and on the
// local NATS server at 127.0.0.1:4222 (skipped when unreachable outside
// CI, failed under CI).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

func TestRunOnEveryBroker(t *testing.T) {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	id := hex.EncodeToString(suffix)
	cases := []struct {
		name  string
		url   string
		local bool
	}{
		{"mem defaults", "mem://example-" + id, false},
		{"mem with window", "mem://example-w-" + id + "?window=2m&maxdeliveries=5", false},
		{"jetstream embedded", "jetstream://embedded/EX" + id + "?subject=ex" + id + "&durable=example&create=true&maxdeliver=5&storage=memory", false},
		{"jetstream local", "jetstream://127.0.0.1:4222/EX" + id + "?subject=ex" + id + "&durable=example&create=true&maxdeliver=5&storage=memory", true},
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
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := run(ctx, tc.url); err != nil {
				t.Fatalf("run(%s): %v", tc.url, err)
			}
		})
	}
}
