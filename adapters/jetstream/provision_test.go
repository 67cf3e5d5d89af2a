package jetstream

// A refused open creates nothing: against the embedded nats-server TestMain
// starts and the local server at 127.0.0.1:4222 (see servers_test.go), and,
// for an open whose second step fails, a private embedded server with a
// user that may create streams but not consumers.

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/window"
)

// TestRefusedOpenCreatesNothing: an open the startup check refuses leaves
// the server as it was, so that the same open with the policy fixed
// succeeds (it used to find the refused open's durable, with MaxDeliver
// -1, and be refused for it not fitting).
func TestRefusedOpenCreatesNothing(t *testing.T) {
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	openConsumer := func(ctx context.Context, raw string) error {
		c, err := dedupq.OpenConsumer(ctx, raw, dedupq.ConsumerOptions{Dedup: guard})
		if err == nil {
			c.Close(ctx)
		}
		return err
	}
	openPublisher := func(ctx context.Context, raw string) error {
		p, err := dedupq.OpenPublisher(ctx, raw, dedupq.PublisherOptions{})
		if err == nil {
			p.Close(ctx)
		}
		return err
	}
	cases := []struct {
		name          string
		streamExisted bool // made by the test before the opens
		open          func(ctx context.Context, raw string) error
		refuse, fix   func(c *Config)
	}{
		{"consumer, unbounded redelivery, stream created for it", false, openConsumer,
			func(c *Config) { c.MaxDeliver = 0 }, func(c *Config) { c.MaxDeliver = 5 }},
		{"consumer, unbounded redelivery, stream existed", true, openConsumer,
			func(c *Config) { c.MaxDeliver = 0 }, func(c *Config) { c.MaxDeliver = 5 }},
		{"publisher, 1s window, stream created for it", false, openPublisher,
			func(c *Config) { c.Duplicates = time.Second }, func(c *Config) { c.Duplicates = 10 * time.Minute }},
	}
	forEachServer(t, func(t *testing.T, srv server) {
		js, err := jetstream.New(connect(t, srv))
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				base := testConfig(t, srv)
				base.MaxDeliver, base.Duplicates = 0, 0
				if tc.streamExisted {
					if _, err := js.CreateStream(ctxT(t), streamConfig(&base)); err != nil {
						t.Fatal(err)
					}
					base.CreateStream = false
				}
				refused, fixed := base, base
				tc.refuse(&refused)
				tc.fix(&fixed)
				err := tc.open(ctxT(t), refused.URL(srv.url))
				if !errors.Is(err, window.ErrUnsafeRetry) {
					t.Fatalf("refused open: %v, want ErrUnsafeRetry", err)
				}
				stream, err := js.Stream(ctxT(t), base.Stream)
				switch {
				case !tc.streamExisted && !errors.Is(err, jetstream.ErrStreamNotFound):
					t.Errorf("the refused open left stream %s behind (lookup: %v)", base.Stream, err)
				case tc.streamExisted && err != nil:
					t.Errorf("the stream that existed before is gone: %v", err)
				case tc.streamExisted:
					if _, err := stream.Consumer(ctxT(t), base.Durable); !errors.Is(err, jetstream.ErrConsumerNotFound) {
						t.Errorf("the refused open left durable %s behind (lookup: %v)", base.Durable, err)
					}
				}
				if err := tc.open(ctxT(t), fixed.URL(srv.url)); err != nil {
					t.Fatalf("the fixed open: %v", err)
				}
				if stream, err = js.Stream(ctxT(t), base.Stream); err != nil {
					t.Fatalf("the fixed open made no stream: %v", err)
				}
				if fixed.Durable != "" && fixed.MaxDeliver != 0 {
					c, err := stream.Consumer(ctxT(t), base.Durable)
					if err != nil {
						t.Fatalf("the fixed open made no durable: %v", err)
					}
					if got := c.CachedInfo().Config.MaxDeliver; got != fixed.MaxDeliver {
						t.Errorf("durable MaxDeliver %d, want the fixed open's %d", got, fixed.MaxDeliver)
					}
				}
			})
		}
	})
}

// TestFailedProvisionRemovesItsStream: a user that may create streams but
// not consumers opens a consumer with create=true. The stream made for the
// open is removed again when the durable cannot be made; a stream that
// existed before is left alone.
func TestFailedProvisionRemovesItsStream(t *testing.T) {
	deny := []string{"$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>"}
	s, err := natsserver.NewServer(&natsserver.Options{
		Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true,
		Users: []*natsserver.User{
			{Username: "admin", Password: "admin"},
			{Username: "limited", Password: "limited", Permissions: &natsserver.Permissions{
				Publish: &natsserver.SubjectPermission{Allow: []string{">"}, Deny: deny},
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("the private server did not start")
	}
	admin, err := nats.Connect(s.ClientURL(), nats.UserInfo("admin", "admin"))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	srv := server{"private", s.ClientURL()}
	for _, existed := range []bool{false, true} {
		t.Run(map[bool]string{false: "stream created for the open", true: "stream existed"}[existed], func(t *testing.T) {
			cfg := testConfig(t, srv)
			if existed {
				if _, err := js.CreateStream(ctxT(t), streamConfig(&cfg)); err != nil {
					t.Fatal(err)
				}
			}
			u, _ := url.Parse(cfg.URL(srv.url))
			u.User = url.UserPassword("limited", "limited")
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			// The server reports each denied request to the connection's
			// error handler, which by default prints it.
			mux := new(dedupq.URLMux)
			mux.Register(Scheme, URLOpener{Options: []nats.Option{nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})}})
			c, err := mux.OpenConsumer(ctx, u.String(), dedupq.ConsumerOptions{})
			if err == nil {
				c.Close(ctx)
				t.Fatal("opened a consumer without the right to create its durable")
			}
			t.Logf("refused as expected: %v", err)
			if !strings.Contains(err.Error(), "creating durable consumer") {
				t.Errorf("error %v, want it to name the durable it could not create", err)
			}
			_, err = js.Stream(ctxT(t), cfg.Stream)
			switch {
			case !existed && !errors.Is(err, jetstream.ErrStreamNotFound):
				t.Errorf("the failed open left stream %s behind (lookup: %v)", cfg.Stream, err)
			case existed && err != nil:
				t.Errorf("the stream that existed before was removed: %v", err)
			}
		})
	}
}

// TestCreateStreamTellsWhoMadeIt: the server answers a create of an
// identical stream as if it made it; only the create that did may remove
// the stream again.
func TestCreateStreamTellsWhoMadeIt(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv server) {
		nc := connect(t, srv)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		cfg := testConfig(t, srv)
		wants := []bool{true, false}
		if v := nc.ConnectedServerVersion(); !serverAtLeast(v, 2, 10, 0) {
			// No stream metadata before 2.10: no create can prove the
			// stream is its own, so none removes it.
			t.Logf("server %s keeps no stream metadata", v)
			wants = []bool{false, false}
		}
		for i, want := range wants {
			_, created, err := createStream(ctxT(t), js, &cfg)
			if err != nil {
				t.Fatalf("create %d: %v", i+1, err)
			}
			if created != want {
				t.Errorf("create %d: created %v, want %v", i+1, created, want)
			}
		}
	})
}
