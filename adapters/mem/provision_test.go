// Talks to: the in-memory broker only, through mem:// URLs on the real
// clock; no services.
package mem_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/window"
)

// TestURLRefusedOpenLeavesNoBroker: the first URL that names a queue fixes
// its broker's options for the whole process. An open the startup check
// refuses must not be that first URL, or the corrected open would then be
// refused for differing from the refused one.
func TestURLRefusedOpenLeavesNoBroker(t *testing.T) {
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name         string
		refused, fix string // URL query of the refused and of the corrected open
		open         func(raw string) error
	}{
		{"consumer with unbounded redelivery", "max_deliveries=0&window=2m", "max_deliveries=5&window=2m", func(raw string) error {
			c, err := dedupq.OpenConsumer(t.Context(), raw, dedupq.ConsumerOptions{Dedup: guard})
			if err == nil {
				c.Close(t.Context())
			}
			return err
		}},
		{"publisher on a 10s window", "window=10s", "window=10m", func(raw string) error {
			p, err := dedupq.OpenPublisher(t.Context(), raw, dedupq.PublisherOptions{})
			if err == nil {
				p.Close(t.Context())
			}
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("url-refused-%d", runs.Add(1))
			err := tc.open("mem://" + name + "?" + tc.refused)
			if !errors.Is(err, window.ErrUnsafeRetry) {
				t.Fatalf("open with %s: %v, want ErrUnsafeRetry", tc.refused, err)
			}
			if b := mem.URLBroker(name); b != nil {
				t.Errorf("the refused open left a broker behind, with %+v", b.Options())
			}
			if err := tc.open("mem://" + name + "?" + tc.fix); err != nil {
				t.Fatalf("the corrected open with %s: %v", tc.fix, err)
			}
			if mem.URLBroker(name) == nil {
				t.Error("the accepted open registered no broker")
			}
		})
	}
}
