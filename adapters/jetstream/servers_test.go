package jetstream

// Test servers. The tests in this package talk to real NATS servers with
// JetStream, of two releases (README, "Tested server versions"; checked
// by versions_test.go): an embedded nats-server
// (github.com/nats-io/nats-server/v2, the release go.mod requires) started
// once by TestMain in this process, and the server that runs on this
// machine at 127.0.0.1:4222 (Debian 12's 2.9.10 on this machine kind: the
// oldest release the tests cover). The local server's tests are skipped
// when it is unreachable and CI is unset; under CI they fail instead.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/adapters/adaptertest"
	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
)

// localAddr is the NATS server this machine runs.
const localAddr = "127.0.0.1:4222"

// embeddedURL is the embedded server's client URL, set by TestMain.
var embeddedURL string

func TestMain(m *testing.M) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	url, stop, err := embedded.Run(ctx, "")
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the embedded NATS server:", err)
		os.Exit(1)
	}
	embeddedURL = url
	code := m.Run()
	stop()
	os.Exit(code)
}

// server is one NATS server the tests run against.
type server struct {
	name string
	url  string
}

// servers lists the embedded and the local server, in that order.
func servers() []server {
	return []server{{"embedded", embeddedURL}, {"local", "nats://" + localAddr}}
}

var (
	localOnce sync.Once
	localErr  error
)

// needServer skips or fails t when srv is the local server and it cannot
// be reached: skipped only outside CI.
func needServer(t testing.TB, srv server) {
	t.Helper()
	if srv.name != "local" {
		return
	}
	localOnce.Do(func() {
		c, err := net.DialTimeout("tcp", localAddr, 2*time.Second)
		if err == nil {
			c.Close()
		}
		localErr = err
	})
	if localErr == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("the local NATS server at %s is unreachable under CI: %v (start it: see the machine's service list)", localAddr, localErr)
	}
	t.Skipf("the local NATS server at %s is unreachable (%v); skipping outside CI", localAddr, localErr)
}

// privateServer is an embedded server of one test's own, which the test
// may shut down and start again: on the same port and store directory, as
// a restarted nats-server would come back. The shared servers are never
// restarted.
type privateServer struct {
	t    testing.TB
	dir  string
	port int
	url  string

	mu   sync.Mutex
	stop func() // nil while the server is down
}

// startPrivate starts a private embedded server, stopped at cleanup.
func startPrivate(ctx context.Context, t testing.TB) *privateServer {
	t.Helper()
	p := &privateServer{t: t, dir: t.TempDir()}
	u, stop, err := embedded.Start(ctx, embedded.Options{Dir: p.dir})
	if err != nil {
		t.Fatalf("starting a private NATS server: %v", err)
	}
	pu, err := neturl.Parse(u)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	p.port, err = strconv.Atoi(pu.Port())
	if err != nil {
		stop()
		t.Fatal(err)
	}
	p.url, p.stop = u, stop
	t.Cleanup(func() { _ = p.shutdown(context.Background()) })
	return p
}

func (p *privateServer) server() server { return server{"private", p.url} }

// shutdown stops the server; its clients see their connection drop.
func (p *privateServer) shutdown(context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stop != nil {
		p.stop()
		p.stop = nil
	}
	return nil
}

// start starts the server again on its port and store directory.
func (p *privateServer) start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stop != nil {
		return nil
	}
	u, stop, err := embedded.Start(ctx, embedded.Options{Dir: p.dir, Port: p.port})
	if err != nil {
		return err
	}
	if u != p.url {
		stop()
		return fmt.Errorf("the restarted server listens at %s, not %s", u, p.url)
	}
	p.stop = stop
	return nil
}

func (p *privateServer) restarter() *adaptertest.Restarter {
	return &adaptertest.Restarter{Stop: p.shutdown, Start: p.start}
}

// forEachServer runs f as one subtest per server.
func forEachServer(t *testing.T, f func(t *testing.T, srv server)) {
	for _, srv := range servers() {
		t.Run(srv.name, func(t *testing.T) {
			needServer(t, srv)
			f(t, srv)
		})
	}
}

// connect dials srv the way the URL opener does, closing at cleanup.
func connect(t testing.TB, srv server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(srv.url, nats.ReconnectBufSize(-1), nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("connecting to %s server %s: %v", srv.name, srv.url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// uniqueName makes a stream or subject name no other test or run uses.
func uniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + strings.ToUpper(hex.EncodeToString(b))
}

// testConfig is a fresh stream with short timings, deleted at cleanup.
func testConfig(t testing.TB, srv server) Config {
	t.Helper()
	name := uniqueName("T")
	cfg := Config{
		Stream: name, Subject: "dedupq.test." + strings.ToLower(name), Durable: "worker",
		CreateStream: true, Storage: jetstream.MemoryStorage,
		Duplicates: 2 * time.Second, AckWait: time.Second, MaxDeliver: 5,
	}
	deleteStreamAtCleanup(t, srv, name)
	return cfg
}

// deleteStreamAtCleanup removes a test stream so the shared local server
// does not fill up.
func deleteStreamAtCleanup(t testing.TB, srv server, name string) {
	t.Cleanup(func() {
		nc, err := nats.Connect(srv.url)
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
	})
}

// ctxT is a context for one test step.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
