// Talks to: the in-memory broker only, through the mem:// URL opener; no
// services.
package mem

import (
	"errors"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/driver"
)

var raceRuns atomic.Int64

// TestURLProvisionRace: two opens of one queue that both found no broker
// meet in the broker of the one that provisions first, or the second is
// refused when that broker differs from what its URL states.
func TestURLProvisionRace(t *testing.T) {
	cases := []struct {
		name, second string // second URL's query
		wantParam    string // "" when the second provisions
	}{
		{"same options", "window=2m", ""},
		{"options left out", "", ""},
		{"another window", "window=3m", "window"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("url-race-%d", raceRuns.Add(1))
			open := func(query string) driver.Topic {
				u, err := url.Parse("mem://" + name + "?" + query)
				if err != nil {
					t.Fatal(err)
				}
				top, err := urlOpener{}.OpenTopic(t.Context(), u)
				if err != nil {
					t.Fatalf("OpenTopic(%s): %v", u, err)
				}
				t.Cleanup(func() { top.Close() })
				return top
			}
			first, second := open("window=2m"), open(tc.second)
			if URLBroker(name) != nil {
				t.Fatal("opening registered a broker before Provision")
			}
			if err := first.(driver.Provisioner).Provision(t.Context()); err != nil {
				t.Fatal(err)
			}
			err := second.(driver.Provisioner).Provision(t.Context())
			if tc.wantParam != "" {
				var pe *dedupq.ParamError
				if !errors.As(err, &pe) || pe.Param != tc.wantParam {
					t.Fatalf("second Provision: %v, want a *dedupq.ParamError for %s", err, tc.wantParam)
				}
				return
			}
			if err != nil {
				t.Fatalf("second Provision: %v", err)
			}
			// Both now publish to the one registered queue.
			for i, top := range []driver.Topic{first, second} {
				res, err := top.SendBatch(t.Context(), []*driver.Message{{ID: fmt.Sprint(i), Body: []byte("x")}})
				if err != nil || res[0].Err != nil {
					t.Fatalf("send %d: %v %v", i, err, res[0].Err)
				}
			}
			if got := URLBroker(name).Stats(name).Stored; got != 2 {
				t.Errorf("the registered queue holds %d messages, want both opens' 2", got)
			}
		})
	}
}
