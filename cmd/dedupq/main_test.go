package main

// Runs the built dedupq command as a subprocess and compares what it prints
// with golden files in testdata (go test -update rewrites them), against:
// the in-memory broker and the embedded JetStream server (inside the
// command: no services), the local NATS server at 127.0.0.1:4222, the
// fauxqs SQS emulator and the Service Bus double (localstack/, started
// here). A case whose service is missing skips outside CI and fails under
// CI. Names that change from run to run (ports, random stream names) are
// replaced by placeholders before comparing.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/localstack/fauxqs"
	servicebusdouble "github.com/dedupq/dedupq/localstack/servicebus-double"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// bin is the built command.
var bin string

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "dedupq-cmd-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "dedupq")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building dedupq: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// policy is the retry policy of the side-by-side cases, shown in README.md.
var policy = filepath.Join("testdata", "policy.json")

// secret is a query value no output may show.
const secret = "hunter2-not-shown"

// cmdCase is one run of the command.
type cmdCase struct {
	golden   string
	args     []string
	wantCode int
	env      []string          // added to the environment
	replace  map[string]string // run-specific text → placeholder
	secrets  []string          // text that must not appear
}

// runCase runs c, checks its exit status, that no secret shows, and
// compares its stdout, after the command line, with the golden file.
func runCase(t *testing.T, c cmdCase) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, c.args...)
	cmd.Env = append(os.Environ(), c.env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running dedupq: %v", err)
	}
	if code != c.wantCode {
		t.Errorf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", code, c.wantCode, stdout.String(), stderr.String())
	}
	for _, s := range append([]string{secret}, c.secrets...) {
		if strings.Contains(stdout.String()+stderr.String(), s) {
			t.Errorf("the output shows %q", s)
		}
	}
	got := "$ dedupq " + shellJoin(c.args) + "\n" + stdout.String()
	for from, to := range c.replace {
		got = strings.ReplaceAll(got, from, to)
	}
	path := filepath.Join("testdata", c.golden+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return got
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test -update rewrites it)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
	return got
}

// shellJoin quotes args as a POSIX shell would need them.
func shellJoin(args []string) string {
	var q []string
	for _, a := range args {
		if regexp.MustCompile(`^[A-Za-z0-9_./:=,-]+$`).MatchString(a) {
			q = append(q, a)
		} else {
			q = append(q, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
		}
	}
	return strings.Join(q, " ")
}

// TestCheckNoServices runs the command on the backends that live inside
// it.
func TestCheckNoServices(t *testing.T) {
	const memURL = "mem://orders?window=2m&ack_wait=30s&max_deliveries=5"
	const embeddedURL = "jetstream://embedded/ORDERS?subject=orders&durable=worker&create=true&max_deliveries=5"
	cases := []cmdCase{
		{golden: "mem-default", args: []string{"check", memURL}},
		{golden: "mem-unsafe", args: []string{"check", "--max-attempts", "10", "--max-backoff", "1m", "mem://orders?window=1m&ack_wait=30s"}, wantCode: 1},
		{golden: "mem-json", args: []string{"check", "--json", "--dedup-ttl", "1m", "mem://orders?window=1m&ack_wait=30s"}, wantCode: 1},
		{golden: "embedded", args: []string{"check", "--dedup-ttl", "10m", embeddedURL}},
		// A publisher span (51.5s) beyond the 30s window: an ordered
		// consumer's check counts the resent copy's wait behind its group.
		{golden: "mem-ordered", args: []string{"check", "--dedup-ttl", "30m", "--ordered", "mem://orders?window=30s&ack_wait=30s&max_deliveries=5"}, wantCode: 1},
		{golden: "mem-ordered-backlog", args: []string{"check", "--dedup-ttl", "30m", "--ordered", "--group-backlog", "7", "mem://orders?window=30s&ack_wait=30s&max_deliveries=5"}},
		{golden: "policy-file", args: []string{"check", "--policy", policy, embeddedURL, "mem://orders?window=10m&ack_wait=30s&max_deliveries=5"},
			wantCode: 1, replace: map[string]string{policy: "policy.json"}},
		// The flag beats the file.
		{golden: "policy-file-flag", args: []string{"check", "--policy", policy, "--max-attempts", "3", memURL},
			replace: map[string]string{policy: "policy.json"}},
		{golden: "cannot-open", args: []string{"check", "mem://orders?token=" + secret, memURL}, wantCode: 2},
		{golden: "malformed", args: []string{"check", "mem://ord%zz?token=" + secret}, wantCode: 2},
		{golden: "unknown-scheme", args: []string{"check", "kafka://orders?password=" + secret}, wantCode: 2},
	}
	for _, c := range cases {
		t.Run(c.golden, func(t *testing.T) { runCase(t, c) })
	}
}

// TestCheckHidesDriverErrors (issue 23, defect 7): a backend's SDK quotes
// what the URL gave it, the SQS endpoint with its path, in the error check
// prints; the endpoint is hidden there too. The endpoint is a loopback port
// nothing listens on: no service.
func TestCheckHidesDriverErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	aws := []string{
		"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_EC2_METADATA_DISABLED=true", "AWS_MAX_ATTEMPTS=1",
		"AWS_CONFIG_FILE=/nonexistent", "AWS_SHARED_CREDENTIALS_FILE=/nonexistent", "AWS_PROFILE=",
	}
	for _, c := range []cmdCase{
		{golden: "sqs-refused", args: []string{"check", "sqs://orders.fifo?region=us-east-1&endpoint=http://" + addr + "/" + secret}, wantCode: 2,
			env: aws, replace: map[string]string{port: "PORT"}},
	} {
		t.Run(c.golden, func(t *testing.T) { runCase(t, c) })
	}
}

// TestUsage: usage errors exit 64 and print nothing on stdout.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"frobnicate"}, {"check"}, {"check", "--jitter", "2", "mem://q"}, {"check", "--no-such-flag", "mem://q"}} {
		cmd := exec.Command(bin, args...)
		var stdout bytes.Buffer
		cmd.Stdout = &stdout
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitUsage || stdout.Len() != 0 {
			t.Errorf("dedupq %q: %v, stdout %q; want exit %d and no stdout", args, err, stdout.String(), exitUsage)
		}
	}
}

// needService skips t outside CI, and fails it under CI, unless something
// listens at addr.
func needService(t *testing.T, what, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	switch {
	case err == nil:
		c.Close()
	case os.Getenv("CI") != "":
		t.Fatalf("%s at %s is unreachable under CI: %v", what, addr, err)
	default:
		t.Skipf("%s at %s is unreachable (%v); skipping outside CI", what, addr, err)
	}
}

// skipUnavailable skips t outside CI when an emulator cannot run here.
func skipUnavailable(t *testing.T, what string, err, unavailable error) {
	t.Helper()
	switch {
	case err == nil:
	case os.Getenv("CI") != "":
		t.Fatalf("%s cannot run under CI: %v", what, err)
	case !errors.Is(err, unavailable):
		t.Fatalf("starting %s: %v", what, err)
	default:
		t.Skipf("%s cannot run here (%v); skipping outside CI", what, err)
	}
}

// TestCheckLocalNATS reads a stream and a durable that exist, and checks a
// URL asking for a stream to be created without creating it.
func TestCheckLocalNATS(t *testing.T) {
	needService(t, "NATS", "127.0.0.1:4222")
	ctx := t.Context()
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	suffix := fmt.Sprintf("%d", time.Now().UnixNano())
	stream, missing := "CMDCHECK_"+suffix, "CMDMISSING_"+suffix
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"cmdcheck." + suffix, "cmdcheck." + suffix + ".>"}, Duplicates: 90 * time.Second, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	if _, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 20 * time.Second, MaxDeliver: 4, BackOff: []time.Duration{20 * time.Second, 40 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	runCase(t, cmdCase{
		golden:   "nats",
		args:     []string{"check", "--dedup-ttl", "5m", "--max-attempts", "8", "jetstream://127.0.0.1:4222/" + stream + "?subject=cmdcheck." + suffix + "&durable=worker"},
		wantCode: 1,
		replace:  map[string]string{suffix: "N"},
	})
	runCase(t, cmdCase{
		golden:  "nats-create",
		args:    []string{"check", "jetstream://127.0.0.1:4222/" + missing + "?subject=cmdmissing." + suffix + "&durable=worker&create=true&max_deliveries=3"},
		replace: map[string]string{suffix: "N"},
	})
	if _, err := js.Stream(ctx, missing); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream %s after the check: %v, want it not created", missing, err)
	}
}

// TestCheckEmulators checks SQS FIFO in fauxqs and a Service Bus queue in
// the double, alone and side by side with one policy: the migration
// question.
func TestCheckEmulators(t *testing.T) {
	emu, err := fauxqs.Start()
	skipUnavailable(t, "fauxqs", err, fauxqs.ErrUnavailable)
	t.Cleanup(func() { _ = emu.Stop() })
	d, err := servicebusdouble.Start()
	skipUnavailable(t, "the servicebus double", err, servicebusdouble.ErrUnavailable)
	t.Cleanup(func() { _ = d.Stop() })

	ctx := t.Context()
	if err := d.CreateQueue(ctx, "orders", servicebusdouble.QueueConfig{RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute, LockDuration: 30 * time.Second, MaxDeliveryCount: 3}); err != nil {
		t.Fatal(err)
	}
	if err := d.CreateQueue(ctx, "orders-sessions", servicebusdouble.QueueConfig{RequiresSession: true, RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute, LockDuration: 30 * time.Second, MaxDeliveryCount: 3}); err != nil {
		t.Fatal(err)
	}
	sbHost := strings.TrimPrefix(strings.SplitN(d.ConnectionString(), ";", 2)[0], "Endpoint=sb://")
	sbHost = strings.TrimSuffix(sbHost, "/")
	sbURL := "servicebus://" + sbHost + "/orders?window=10m&ack_wait=30s&max_deliveries=3"
	sbSessionsURL := "servicebus://" + sbHost + "/orders-sessions?window=10m&ack_wait=30s&max_deliveries=3&sessions=true"
	sqsURL := "sqs://orders.fifo?region=us-east-1&endpoint=" + emu.Endpoint + "&create=true&ack_wait=30s&max_deliveries=3"
	env := []string{
		"SERVICEBUS_CONNECTION_STRING=" + d.ConnectionString(),
		"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_EC2_METADATA_DISABLED=true",
	}
	replace := map[string]string{sbHost: "127.0.0.1:PORT", emu.Endpoint: "http://127.0.0.1:PORT"}
	secrets := []string{emu.Endpoint, d.ConnectionString()}

	replace[policy] = "policy.json"
	for _, c := range []cmdCase{
		{golden: "servicebus", args: []string{"check", "--dedup-ttl", "1h", sbURL}},
		{golden: "servicebus-sessions", args: []string{"check", "--dedup-ttl", "1h", "--ordered", "--group-backlog", "10", sbSessionsURL}},
		{golden: "sqs", args: []string{"check", sqsURL}},
		{golden: "migration", args: []string{"check", "--policy", policy, sbURL, sqsURL}, wantCode: 1},
	} {
		c.env, c.replace, c.secrets = env, replace, secrets
		t.Run(c.golden, func(t *testing.T) { runCase(t, c) })
	}

	// create=true asked for the queue; the check created nothing.
	cfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion("us-east-1"),
		awsconfig.WithCredentialsProvider(aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test"}, nil
		})))
	if err != nil {
		t.Fatal(err)
	}
	client := awssqs.NewFromConfig(cfg, func(o *awssqs.Options) { o.BaseEndpoint = aws.String(emu.Endpoint) })
	out, err := client.ListQueues(ctx, &awssqs.ListQueuesInput{})
	if err != nil {
		t.Fatal(err)
	}
	if len(out.QueueUrls) != 0 {
		t.Errorf("queues after the check: %v; want none", out.QueueUrls)
	}
}

// TestREADME: every fenced block of README.md whose preceding text names a
// file under cmd/dedupq/testdata is that file, so the output the README
// shows is what the command prints (the golden tests above keep the files
// true).
func TestREADME(t *testing.T) {
	text, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile(`cmd/dedupq/(testdata/[A-Za-z0-9_.-]+)`)
	var (
		prev, file string
		para       string
		in         bool
		body       strings.Builder
		checked    int
	)
	for line := range strings.SplitSeq(string(text), "\n") {
		switch {
		case !in && strings.HasPrefix(line, "```"):
			in, file = true, ""
			if para != "" {
				prev, para = para, ""
			}
			if m := named.FindAllStringSubmatch(prev, -1); m != nil {
				file = m[len(m)-1][1]
			}
			body.Reset()
		case in && strings.TrimSpace(line) == "```":
			in = false
			if file == "" {
				continue
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Errorf("README.md names %s: %v", file, err)
				continue
			}
			if body.String() != string(want) {
				t.Errorf("README.md's block after %q differs from %s\nREADME:\n%s\nfile:\n%s", prev, file, body.String(), want)
			}
			checked++
		case in:
			body.WriteString(line + "\n")
		case strings.TrimSpace(line) == "":
			// A block is named by the paragraph just before it.
			if para != "" {
				prev, para = para, ""
			}
		default:
			para += " " + line
		}
	}
	if checked < 3 {
		t.Errorf("README.md shows %d blocks of cmd/dedupq/testdata, want the check's output on two backends and the policy", checked)
	}
}
