package main

// Runs the example unchanged on the in-memory broker, which keeps a
// group's order (every customer's orders must come out in publish order),
// and on the NATS server package embedded runs in this process, whose
// consumer cannot keep it yet (the consumer must refuse to start): no
// services.

import (
	"context"
	"strings"
	"testing"
)

func TestOrderedExample(t *testing.T) {
	for _, tt := range []struct {
		name, url string
		want      []string
	}{
		{"mem", "", []string{
			"customer-1: orders 1 2 3 4 5\n",
			"customer-2: orders 1 2 3 4 5\n",
			"customer-3: orders 1 2 3 4 5\n",
		}},
		{"embedded JetStream refuses", "jetstream://embedded/ORDERED?subject=ordered&durable=ordered&create=true&max_deliveries=5",
			[]string{"refused: dedupq: the subscription cannot keep the order of a group key"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			if err := run(context.Background(), &out, tt.url); err != nil {
				t.Fatalf("run: %v\n%s", err, out.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("the output lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}
