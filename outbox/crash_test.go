package outbox_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/jetstream" // registers jetstream://
	"github.com/dedupq/dedupq/clock"
	"github.com/dedupq/dedupq/outbox"
)

const (
	crashStepEnv   = "OUTBOX_CRASH_STEP"
	crashTableEnv  = "OUTBOX_CRASH_TABLE"
	crashStreamEnv = "OUTBOX_CRASH_STREAM"
	// crashLease is the child relay's lease; the survivor's clock runs
	// this far ahead, so it finds the lease lapsed without waiting.
	crashLease = 2 * time.Second
)

func natsURL() string { return cmp.Or(os.Getenv("DEDUPQ_NATS_URL"), "127.0.0.1:4222") }

func streamURL(stream string) string {
	return fmt.Sprintf("jetstream://%s/%s?subject=%s&create=true&window=2m", natsURL(), stream, stream)
}

// crashChild runs in a copy of the test binary: one relay pass over the
// table that SIGKILLs its own process at step. It returns only on error.
func crashChild(step string) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	pub, err := dedupq.OpenPublisher(ctx, streamURL(os.Getenv(crashStreamEnv)), dedupq.PublisherOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r, err := outbox.NewRelay(pool, pub, outbox.Options{Table: os.Getenv(crashTableEnv), Lease: crashLease})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	outbox.SetHook(r, func(s string) {
		if s == step {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	})
	_, err = r.RunOnce(ctx)
	fmt.Fprintf(os.Stderr, "relay pass ended without reaching %q: %v\n", step, err)
	return 3
}

// offsetClock is the real clock moved forward by d.
type offsetClock struct {
	clock.Clock
	d time.Duration
}

func (c offsetClock) Now() time.Time { return c.Clock.Now().Add(c.d) }

// A relay process is killed with SIGKILL at each step of publishing one
// row; a second relay then finishes the outbox. Each time the JetStream
// stream holds the message exactly once.
func TestCrashAtEveryStep(t *testing.T) {
	pool := newPool(t)
	nc, err := nats.Connect(natsURL())
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("NATS: %v", err)
		}
		t.Skipf("no NATS: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		step                 string
		wantResent, wantDups int64
	}{
		{step: "claimed", wantResent: 1},                // killed before publishing
		{step: "published", wantResent: 1, wantDups: 1}, // after publishing, before marking
		{step: "marked"},                                // after marking
	} {
		t.Run(tt.step, func(t *testing.T) {
			ctx := context.Background()
			table := newTable(t, pool)
			stream := randName("OUTBOX_")
			t.Cleanup(func() { js.DeleteStream(context.Background(), stream) })
			pub, err := dedupq.OpenPublisher(ctx, streamURL(stream), dedupq.PublisherOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pub.Close(context.Background()) })
			survivor := newRelay(t, pool, pub, outbox.Options{Table: table, Clock: offsetClock{clock.Real(), 2 * crashLease}})
			enqueue(t, pool, survivor, &dedupq.Message{ID: "order-1", Body: []byte("42"), GroupKey: "customer-7"})

			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), crashStepEnv+"="+tt.step, crashTableEnv+"="+table, crashStreamEnv+"="+stream)
			out, err := cmd.CombinedOutput()
			if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("child was not killed at %q: %v\n%s", tt.step, err, out)
			}
			drain(t, survivor)
			s, err := js.Stream(ctx, stream)
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			pending, parked := status(t, pool, table)
			st := survivor.Stats()
			t.Logf("killed at %s: stream holds %d message(s); survivor resent %d, PubAck duplicate %d; pending %d, parked %d",
				tt.step, info.State.Msgs, st.Resent, st.Duplicates, pending, parked)
			if info.State.Msgs != 1 || pending != 0 || parked != 0 || st.Resent != tt.wantResent || st.Duplicates != tt.wantDups {
				t.Fatalf("stream holds %d, pending %d, parked %d, resent %d, duplicates %d; want 1, 0, 0, %d, %d",
					info.State.Msgs, pending, parked, st.Resent, st.Duplicates, tt.wantResent, tt.wantDups)
			}
		})
	}
}
