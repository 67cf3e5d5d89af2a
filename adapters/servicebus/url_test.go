package servicebus_test

// URL parsing (no network), plus one open through the URL against the
// double (started by TestMain).

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/servicebus"
	"github.com/dedupq/dedupq/window"
)

func TestParseURL(t *testing.T) {
	cases := []struct {
		url      string
		entity   servicebus.Entity
		connEnv  string
		stated   *servicebus.EntityProperties
		create   *servicebus.EntityProperties
		idle     time.Duration
		badParam string
	}{
		{url: "servicebus://ns.servicebus.windows.net/orders", entity: servicebus.Entity{Queue: "orders"}, connEnv: servicebus.DefaultConnEnv},
		{url: "servicebus://ns.servicebus.windows.net/events?kind=topic", entity: servicebus.Entity{Topic: "events"}, connEnv: servicebus.DefaultConnEnv},
		{url: "servicebus://ns.servicebus.windows.net/events/subscriptions/billing?conn_env=SB_CONN", entity: servicebus.Entity{Topic: "events", Subscription: "billing"}, connEnv: "SB_CONN"},
		{url: "servicebus://localhost:5672/orders?window=10m&ack_wait=30s&max_deliveries=3", entity: servicebus.Entity{Queue: "orders"}, connEnv: servicebus.DefaultConnEnv,
			stated: &servicebus.EntityProperties{RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute, LockDuration: 30 * time.Second, MaxDeliveryCount: 3, MaxMessageBytes: servicebus.DefaultMaxMessageBytes}},
		{url: "servicebus://localhost/orders?window=none", entity: servicebus.Entity{Queue: "orders"}, connEnv: servicebus.DefaultConnEnv,
			stated: &servicebus.EntityProperties{LockDuration: time.Minute, MaxDeliveryCount: 10, MaxMessageBytes: servicebus.DefaultMaxMessageBytes}},
		{url: "servicebus://localhost/orders?window=10m&sessions=true&session_idle=5s", entity: servicebus.Entity{Queue: "orders"}, connEnv: servicebus.DefaultConnEnv, idle: 5 * time.Second,
			stated: &servicebus.EntityProperties{RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute, LockDuration: time.Minute, MaxDeliveryCount: 10, MaxMessageBytes: servicebus.DefaultMaxMessageBytes, RequiresSession: true}},
		{url: "servicebus://ns/orders?create=true&sessions=true&ack_wait=30s", entity: servicebus.Entity{Queue: "orders"}, connEnv: servicebus.DefaultConnEnv,
			create: &servicebus.EntityProperties{RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute, LockDuration: 30 * time.Second, MaxDeliveryCount: 10, MaxMessageBytes: servicebus.DefaultMaxMessageBytes, RequiresSession: true}},
		{url: "servicebus://ns/events/subscriptions/billing?create=true&window=none&max_deliveries=3", entity: servicebus.Entity{Topic: "events", Subscription: "billing"}, connEnv: servicebus.DefaultConnEnv,
			create: &servicebus.EntityProperties{LockDuration: time.Minute, MaxDeliveryCount: 3, MaxMessageBytes: servicebus.DefaultMaxMessageBytes}},
		{url: "servicebus://ns/orders?create=false", entity: servicebus.Entity{Queue: "orders"}, connEnv: servicebus.DefaultConnEnv},
		{url: "servicebus://ns/orders?sessions=true", badParam: "sessions"},
		{url: "servicebus://ns/orders?create=true&sessions=maybe", badParam: "sessions"},
		{url: "servicebus://ns/orders?create=yes", badParam: "create"},
		{url: "servicebus://ns/orders?session_idle=10ms", badParam: "session_idle"},
		{url: "sqs://ns/orders", badParam: "scheme"},
		{url: "servicebus://user:secret@ns/orders", badParam: "userinfo"},
		{url: "servicebus:///orders", badParam: "host"},
		{url: "servicebus://ns/", badParam: "path"},
		{url: "servicebus://ns/orders?SharedAccessKey=secret", badParam: "SharedAccessKey"},
		{url: "servicebus://ns/orders?sharedaccesssignature=secret", badParam: "sharedaccesssignature"},
		{url: "servicebus://ns;SharedAccessKey=secret/orders", badParam: "host"},
		{url: "servicebus://ns/orders;SharedAccessKey=secret", badParam: "path"},
		{url: "servicebus://ns/orders?conn_env=Endpoint%3Dsb://ns/;SharedAccessKey%3Dsecret", badParam: "query"},
		{url: "servicebus://ns/orders?conn_env=Endpoint%3Dsb://ns/%3BSharedAccessKey%3Dsecret", badParam: "conn_env"},
		{url: "servicebus://ns/orders?color=blue", badParam: "color"},
		{url: "servicebus://ns/orders?kind=stream", badParam: "kind"},
		{url: "servicebus://ns/events/subscriptions/b?kind=queue", badParam: "kind"},
		{url: "servicebus://ns/-bad", badParam: "path"},
		{url: "servicebus://ns/events/subscriptions/a/b", badParam: "path"},
		{url: "servicebus://ns/orders?conn_env=1BAD", badParam: "conn_env"},
		{url: "servicebus://ns/orders?window=5s", badParam: "window"},
		{url: "servicebus://ns/orders?window=10m&ack_wait=10m", badParam: "ack_wait"},
		{url: "servicebus://ns/orders?ack_wait=30s", badParam: "ack_wait"},
		{url: "servicebus://ns/orders?max_batch=0", badParam: "max_batch"},
		{url: "servicebus://ns/orders?window=1m&window=2m", badParam: "window"},
	}
	for _, tc := range cases {
		t.Run(tc.url, func(t *testing.T) {
			u, err := url.Parse(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			c, err := servicebus.ParseURL(u)
			if tc.badParam != "" {
				var pe *dedupq.ParamError
				if !errors.As(err, &pe) || pe.Param != tc.badParam {
					t.Fatalf("ParseURL error %v, want a *dedupq.ParamError for %q", err, tc.badParam)
				}
				if strings.Contains(pe.Error(), "secret") {
					t.Errorf("error text leaks the password: %v", pe)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseURL: %v", err)
			}
			if c.Entity != tc.entity || c.ConnEnv != tc.connEnv {
				t.Errorf("entity %+v env %q, want %+v %q", c.Entity, c.ConnEnv, tc.entity, tc.connEnv)
			}
			if (c.Options.Stated == nil) != (tc.stated == nil) || (tc.stated != nil && *c.Options.Stated != *tc.stated) {
				t.Errorf("Stated = %+v, want %+v", c.Options.Stated, tc.stated)
			}
			if (c.Options.Create == nil) != (tc.create == nil) || (tc.create != nil && *c.Options.Create != *tc.create) {
				t.Errorf("Create = %+v, want %+v", c.Options.Create, tc.create)
			}
			if c.Options.SessionIdle != tc.idle {
				t.Errorf("SessionIdle = %s, want %s", c.Options.SessionIdle, tc.idle)
			}
		})
	}
}

func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"servicebus://ns.servicebus.windows.net/orders",
		"servicebus://localhost:5672/orders?window=10m&ack_wait=30s",
		"servicebus://ns/events/subscriptions/billing?conn_env=X",
		"servicebus://u:p@ns/orders?SharedAccessKey=k",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		u, err := url.Parse(raw)
		if err != nil {
			return
		}
		c, err := servicebus.ParseURL(u)
		if err != nil {
			var pe *dedupq.ParamError
			if !errors.As(err, &pe) {
				t.Fatalf("ParseURL(%q) error %T %v, want a *dedupq.ParamError", raw, err, err)
			}
			return
		}
		if u.User != nil {
			t.Fatalf("ParseURL(%q) accepted credentials in the URL", raw)
		}
		e := c.Entity
		if (e.Queue == "") == (e.Topic == "") || (e.Queue != "" && e.Subscription != "") {
			t.Fatalf("ParseURL(%q) = entity %+v: want exactly one of queue or topic", raw, e)
		}
		if c.ConnEnv == "" {
			t.Fatalf("ParseURL(%q): no connection string variable", raw)
		}
		if st := c.Options.Stated; st != nil && st.RequiresDuplicateDetection && (st.DuplicateDetectionWindow < 20*time.Second || st.DuplicateDetectionWindow > 7*24*time.Hour) {
			t.Fatalf("ParseURL(%q): stated window %s outside Service Bus's range", raw, st.DuplicateDetectionWindow)
		}
	})
}

// TestOpenByURL opens a publisher and a consumer through servicebus://
// URLs on the double: an emulator connection string from an environment
// variable, the properties stated (the SDK's management client cannot
// reach an emulator).
func TestOpenByURL(t *testing.T) {
	d := needDouble(t)
	a := newFakeAdmin()
	q := newQueue(t, d, a, servicebus.EntityProperties{RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute, LockDuration: 30 * time.Second, MaxDeliveryCount: 3})
	t.Setenv("DEDUPQ_TEST_SB", d.ConnectionString())
	host := "127.0.0.1:" + strings.TrimPrefix(strings.SplitN(d.ConnectionString(), ";", 2)[0], "Endpoint=sb://127.0.0.1:")
	raw := "servicebus://" + host + "/" + q + "?conn_env=DEDUPQ_TEST_SB&window=10m&ack_wait=30s&max_deliveries=3"
	ctx := t.Context()
	p, err := dedupq.OpenPublisher(ctx, raw, dedupq.PublisherOptions{})
	if err != nil {
		t.Fatalf("OpenPublisher: %v", err)
	}
	defer p.Close(context.Background())
	if w := p.Window(); w.Duration != 10*time.Minute || w.Source != window.SourceConfigured {
		t.Errorf("Window = %s, want the stated 10m", w)
	}
	if _, err := p.Publish(ctx, &dedupq.Message{ID: "url-1", Body: []byte("hello"), Attributes: map[string]string{"k": "v"}}); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	c, err := dedupq.OpenConsumer(ctx, raw, dedupq.ConsumerOptions{})
	if err != nil {
		t.Fatalf("OpenConsumer: %v", err)
	}
	defer c.Close(ctx)
	if r := c.Redelivery(); r.AckWait != 30*time.Second || r.MaxDeliveries != 3 {
		t.Errorf("Redelivery = %s, want the stated 30s and 3", r)
	}
	rctx, cancel := context.WithCancel(ctx)
	got := make(chan dedupq.Delivery, 1)
	done := make(chan error, 1)
	go func() {
		done <- c.Run(rctx, func(_ context.Context, d *dedupq.Delivery) error {
			select {
			case got <- *d:
			default:
			}
			return nil
		})
	}()
	deadline := time.NewTimer(15 * time.Second)
	defer deadline.Stop()
	select {
	case dv := <-got:
		if dv.Message.ID != "url-1" || string(dv.Message.Body) != "hello" || dv.Message.Attributes["k"] != "v" || dv.Attempt != 1 {
			t.Errorf("delivery %+v, want url-1 attempt 1 with its body and attribute", dv)
		}
	case <-deadline.C:
		t.Error("no delivery within 15s")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}

	// A session queue, stated with sessions=true, is consumed through the
	// sessions the Subscription accepts, and orders.
	sq := newQueue(t, d, a, servicebus.EntityProperties{RequiresSession: true, RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute, LockDuration: 30 * time.Second, MaxDeliveryCount: 3})
	sraw := "servicebus://" + host + "/" + sq + "?conn_env=DEDUPQ_TEST_SB&window=10m&ack_wait=30s&max_deliveries=3&sessions=true&session_idle=200ms"
	sp, err := dedupq.OpenPublisher(ctx, sraw, dedupq.PublisherOptions{})
	if err != nil {
		t.Fatalf("OpenPublisher (sessions): %v", err)
	}
	defer sp.Close(context.Background())
	if _, err := sp.Publish(ctx, &dedupq.Message{ID: "s-1", GroupKey: "g", Body: []byte("in a session")}); err != nil {
		t.Fatalf("Publish (sessions): %v", err)
	}
	sc, err := dedupq.OpenConsumer(ctx, sraw, dedupq.ConsumerOptions{Ordered: true})
	if err != nil {
		t.Fatalf("OpenConsumer (sessions, Ordered): %v", err)
	}
	defer sc.Close(ctx)
	sctx, scancel := context.WithCancel(ctx)
	sgot := make(chan dedupq.Delivery, 1)
	go func() {
		done <- sc.Run(sctx, func(_ context.Context, d *dedupq.Delivery) error {
			select {
			case sgot <- *d:
			default:
			}
			return nil
		})
	}()
	deadline.Reset(15 * time.Second)
	select {
	case dv := <-sgot:
		if dv.Message.ID != "s-1" || dv.Message.GroupKey != "g" {
			t.Errorf("delivery %+v, want s-1 in group g", dv)
		}
	case <-deadline.C:
		t.Error("no delivery from the session queue within 15s")
	}
	scancel()
	if err := <-done; err != nil {
		t.Errorf("Run (sessions): %v", err)
	}

	// Missing or wrong connection strings are parameter errors.
	for _, tc := range []struct{ name, url string }{
		{"unset variable", "servicebus://" + host + "/" + q + "?conn_env=DEDUPQ_TEST_SB_UNSET&window=10m"},
		{"another namespace", "servicebus://other.example:5672/" + q + "?conn_env=DEDUPQ_TEST_SB&window=10m"},
	} {
		_, err := dedupq.OpenPublisher(ctx, tc.url, dedupq.PublisherOptions{})
		var pe *dedupq.ParamError
		if !errors.As(err, &pe) || pe.Param != "conn_env" {
			t.Errorf("%s: error %v, want a *dedupq.ParamError for conn_env", tc.name, err)
		}
	}
}
