package main

// Runs the program as `go run ./examples/observability` does, on the
// embedded JetStream server (no services), and checks its metrics and its
// machine-readable last line.

import (
	"context"
	"strings"
	"testing"

	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
)

func TestRun(t *testing.T) {
	var out strings.Builder
	err := run(t.Context(), &out)
	if serr := embedded.Shutdown(context.Background()); err == nil {
		err = serr
	}
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if last := lines[len(lines)-1]; last != "stored=3 broker_duplicates=1 acked=3 ran=3" {
		t.Errorf("last line %q, want stored=3 broker_duplicates=1 acked=3 ran=3\n%s", last, out.String())
	}
	for _, want := range []string{
		"dedupq.publish.messages{dedupq.outcome=stored,messaging.destination.name=OBS,messaging.system=jetstream} 3",
		"dedupq.publish.messages{dedupq.outcome=broker_duplicate,messaging.destination.name=OBS,messaging.system=jetstream} 1",
		"dedupq.consume.deliveries{dedupq.outcome=ack,messaging.destination.name=OBS,messaging.destination.subscription.name=worker,messaging.system=jetstream} 3",
		"dedupq.dedup.decisions{dedupq.outcome=ran,dedupq.store=memstore} 3",
		"dedupq.window (s){dedupq.role=publisher,messaging.destination.name=OBS,messaging.system=jetstream} 120",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
