package embedded_test

// Starts real embedded nats-servers in this process.

import (
	"context"
	"fmt"
	"log"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
)

func ExampleRun() {
	url, stop, err := embedded.Run(context.Background(), "") // temporary store, removed by stop
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	nc, err := nats.Connect(url)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	fmt.Println("headers:", nc.HeadersSupported())
	// Output: headers: true
}

func TestStart(t *testing.T) {
	cases := []struct {
		name string
		opts embedded.Options
		// maxPayload is what clients should see.
		maxPayload int64
	}{
		{"defaults", embedded.Options{}, 1 << 20},
		{"own directory and payload", embedded.Options{Dir: t.TempDir(), MaxPayload: 8192}, 8192},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			url, stop, err := embedded.Start(ctx, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			nc, err := nats.Connect(url)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			if got := nc.MaxPayload(); got != tc.maxPayload {
				t.Errorf("MaxPayload = %d, want %d", got, tc.maxPayload)
			}
			js, _ := jetstream.New(nc)
			if _, err := js.AccountInfo(ctx); err != nil {
				t.Errorf("JetStream not enabled: %v", err)
			}
			stop()
			stop() // a second stop is harmless
			if !nc.IsClosed() && nc.IsConnected() {
				// The client notices asynchronously; a publish must fail
				// soon, never hang.
				if err := nc.FlushTimeout(2 * time.Second); err == nil {
					t.Errorf("flush succeeded after the server stopped")
				}
			}
		})
	}
}
