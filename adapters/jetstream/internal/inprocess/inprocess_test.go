package inprocess_test

// A program that links the jetstream adapter but not package embedded:
// this test binary, which talks to no server. Opening
// jetstream://embedded/… must fail at once, saying what to import, and
// never ask DNS for a host named "embedded".

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/jetstream"
	"github.com/dedupq/dedupq/adapters/jetstream/internal/inprocess"
)

func TestEmbeddedHostWithoutPackageEmbedded(t *testing.T) {
	if inprocess.Registered() != nil {
		t.Fatal("this test binary must not link package embedded")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const hint = `import _ "github.com/dedupq/dedupq/adapters/jetstream/embedded"`
	cases := []struct {
		name, url, want string
	}{
		{"publisher", "jetstream://embedded/ORDERS?subject=orders", hint},
		{"consumer", "jetstream://embedded/ORDERS?subject=orders&durable=billing", hint},
		{"any case", "jetstream://Embedded/ORDERS?subject=orders", hint},
		{"with a port", "jetstream://embedded:4222/ORDERS?subject=orders", "has no port"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if strings.Contains(tc.url, "durable=") {
				_, err = dedupq.OpenConsumer(ctx, tc.url, dedupq.ConsumerOptions{})
			} else {
				_, err = dedupq.OpenPublisher(ctx, tc.url, dedupq.PublisherOptions{})
			}
			var pe *dedupq.ParamError
			if !errors.As(err, &pe) || pe.Param != "host" {
				t.Fatalf("error %v, want a *dedupq.ParamError about the host", err)
			}
			t.Log(err)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func TestRegisterTwicePanics(t *testing.T) {
	inprocess.Register(fake{})
	t.Cleanup(inprocess.Unregister)
	defer func() {
		if recover() == nil {
			t.Error("a second Register did not panic")
		}
	}()
	inprocess.Register(fake{})
}

type fake struct{ inprocess.Server }
