package pubsub_test

// Test servers: pstest, the in-process fake that always runs, and the
// official Pub/Sub emulator (Debian package google-cloud-cli-pubsub-emulator),
// which TestMain starts on a free loopback port when it is installed.
//
// Without the emulator, tests that need it skip with a message, unless CI is
// set, when they fail: it is installed on this project's machines, so CI
// must not go green without it.
//
// pstest runs in a child process (this test binary, re-executed): pstest
// v2.8.1 has data races of its own (ModifyAckDeadline writes a message that
// its StreamingPull send loop is marshalling), which `go test -race` would
// pin on whichever of our tests was running. In the child they are logged
// to a file instead, while the adapter under test stays race-checked here.
// The Restart check starts children of its own the same way, serving on a
// fixed port (through a small TCP forwarder to pstest) with their topics
// and subscriptions made before the port opens.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gpubsub "cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	dpubsub "github.com/dedupq/dedupq/adapters/pubsub"
	"github.com/dedupq/dedupq/internal/childproc"
)

const emulatorPackage = "google-cloud-cli-pubsub-emulator"

// emulatorAddr is the running emulator's host:port; emulatorErr says why
// there is none.
var (
	emulatorAddr string
	emulatorErr  error
	pstestAddr   string
)

// childEnv marks the re-executed test binary that only serves pstest.
const childEnv = "DEDUPQ_PSTEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		servePstest()
		return
	}
	addr, stopPstest, err := startPstest()
	if err != nil {
		fmt.Fprintln(os.Stderr, "adapters/pubsub: starting pstest:", err)
		os.Exit(1)
	}
	pstestAddr = addr
	stop := startEmulator()
	code := m.Run()
	stop()
	stopPstest()
	os.Exit(code)
}

// servePstest runs in the child: it serves pstest, prints its address and
// exits when its standard input closes (so it cannot outlive the parent).
func servePstest() {
	// pstest refuses ack deadlines under 10 s unless told otherwise; the
	// suite's negative checks wait out the lease, so keep it short.
	pstest.SetMinAckDeadline(time.Second)
	srv := pstest.NewServer()
	addr := srv.Addr
	if port := os.Getenv(childPortEnv); port != "" {
		// A child that a restart test stops and starts again: its topics
		// and subscriptions exist before it accepts a connection, on the
		// same port each time.
		if err := setupPstest(srv, os.Getenv(childSetupEnv)); err != nil {
			fmt.Fprintln(os.Stderr, "pstest child: setup:", err)
			os.Exit(1)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+port)
		if err != nil {
			fmt.Fprintln(os.Stderr, "pstest child:", err)
			os.Exit(1)
		}
		go proxy(ln, srv.Addr)
		addr = ln.Addr().String()
	}
	fmt.Println(addr)
	_, _ = io.Copy(io.Discard, os.Stdin)
	srv.Close()
}

// The environment of a pstest child that serves on a given port
// (childPortEnv) with topics and subscriptions made first (childSetupEnv,
// a pstestSetup in JSON).
const (
	childPortEnv  = "DEDUPQ_PSTEST_PORT"
	childSetupEnv = "DEDUPQ_PSTEST_SETUP"
)

// pstestSetup is what a child creates before it serves.
type pstestSetup struct {
	Topics        []string          `json:"topics"`
	Subscriptions []json.RawMessage `json:"subscriptions"` // protojson pb.Subscription
}

func setupPstest(srv *pstest.Server, spec string) error {
	var setup pstestSetup
	if spec != "" {
		if err := json.Unmarshal([]byte(spec), &setup); err != nil {
			return err
		}
	}
	ctx := context.Background()
	for _, name := range setup.Topics {
		if _, err := srv.GServer.CreateTopic(ctx, &pb.Topic{Name: name}); err != nil {
			return err
		}
	}
	for _, raw := range setup.Subscriptions {
		var sub pb.Subscription
		if err := protojson.Unmarshal(raw, &sub); err != nil {
			return err
		}
		if _, err := srv.GServer.CreateSubscription(ctx, &sub); err != nil {
			return err
		}
	}
	return nil
}

// proxy forwards every connection ln accepts to addr, until ln closes.
func proxy(ln net.Listener, addr string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			up, err := net.Dial("tcp", addr)
			if err != nil {
				return
			}
			defer up.Close()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			_, _ = io.Copy(c, up)
		}()
	}
}

// startPstest re-executes this test binary as a pstest server.
func startPstest() (addr string, stop func(), err error) { return startPstestChild(nil) }

// startPstestChild is startPstest with extra environment for the child.
func startPstestChild(env []string) (addr string, stop func(), err error) {
	env = append([]string{childEnv + "=1",
		"GORACE=exitcode=0 log_path=" + filepath.Join(os.TempDir(), "dedupq-pstest-race")}, env...)
	return childproc.Start(env...)
}

// findEmulator returns the emulator script from the Debian package.
func findEmulator() (string, error) {
	out, err := exec.Command("dpkg", "-L", emulatorPackage).Output()
	if err != nil {
		return "", fmt.Errorf("the Debian package %s is not installed (%v)", emulatorPackage, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasSuffix(line, "bin/cloud-pubsub-emulator") {
			return line, nil
		}
	}
	return "", fmt.Errorf("the package %s has no bin/cloud-pubsub-emulator", emulatorPackage)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startEmulator starts the emulator and polls until it answers; it returns
// the function that stops it.
func startEmulator() (stop func()) {
	script, err := findEmulator()
	if err != nil {
		emulatorErr = err
		return func() {}
	}
	port, err := freePort()
	if err != nil {
		emulatorErr = err
		return func() {}
	}
	dir, err := os.MkdirTemp("", "pubsub-emulator-")
	if err != nil {
		emulatorErr = err
		return func() {}
	}
	log, err := os.Create(filepath.Join(dir, "emulator.log"))
	if err != nil {
		emulatorErr = err
		return func() {}
	}
	cmd := exec.Command(script, "--host=127.0.0.1", fmt.Sprintf("--port=%d", port))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		emulatorErr = fmt.Errorf("starting %s: %w", script, err)
		return func() {}
	}
	// The script execs java, so this PID is the java process's.
	stop = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
		os.RemoveAll(dir)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := waitReady(addr, 60*time.Second); err != nil {
		stop()
		out, _ := os.ReadFile(log.Name())
		emulatorErr = fmt.Errorf("the emulator on %s did not become ready: %v; its output:\n%s", addr, err, out)
		return func() {}
	}
	emulatorAddr = addr
	return stop
}

// waitReady polls the emulator with a real request until it answers.
func waitReady(addr string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	c, err := dpubsub.NewClient(ctx, "ready-check", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = listTopics(rctx, c)
		rcancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

func listTopics(ctx context.Context, c *gpubsub.Client) (int, error) {
	it := c.TopicAdminClient.ListTopics(ctx, &pb.ListTopicsRequest{Project: "projects/" + c.Project()})
	n := 0
	for {
		_, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n++
	}
}

// needEmulator returns the emulator's address, or skips (fails under CI).
func needEmulator(t testing.TB) string {
	t.Helper()
	if emulatorAddr != "" {
		return emulatorAddr
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("the Pub/Sub emulator is required under CI: %v", emulatorErr)
	}
	t.Skipf("the Pub/Sub emulator is not available, skipping (install %s to run this): %v", emulatorPackage, emulatorErr)
	return ""
}

var seq atomic.Int64

// uniqueID makes a resource ID (at least 3 characters, as the emulator
// requires) unique within the test binary's run.
func uniqueID(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e9, seq.Add(1))
}

// optionsFor connects a plain client (with the library's default retries)
// to a server without TLS or credentials.
func optionsFor(addr string) []option.ClientOption {
	return []option.ClientOption{
		option.WithEndpoint(addr),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
		option.WithoutAuthentication(),
	}
}
