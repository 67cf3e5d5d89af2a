// Package servicebusdouble starts the Service Bus test double (start.mjs: an
// AMQP 1.0 broker written with the npm package rhea, installed next to this
// file from package-lock.json with `npm ci --prefix
// localstack/servicebus-double`) for tests that need Service Bus without
// Azure or Docker. The azservicebus SDK reaches it through
// ConnectionString, which sets UseDevelopmentEmulator=true (plain AMQP).
//
// The double is only as true as what it models; start.mjs's header lists
// what it does and does not. In short: queues only, no sessions, no
// management (HTTP/ATOM) API — queues are created through this package
// (CreateQueue), and entity properties reach the adapter through its seam.
package servicebusdouble

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"time"
)

// Double is a running double.
type Double struct {
	// Port is the AMQP port on 127.0.0.1.
	Port int
	// ControlURL is the base URL of its HTTP control API.
	ControlURL string
	stop       func() error
}

// QueueConfig is what CreateQueue sets on a queue: the properties the
// double models. Zero fields take Service Bus's defaults.
type QueueConfig struct {
	// RequiresDuplicateDetection switches duplicate detection on.
	RequiresDuplicateDetection bool
	// DuplicateDetectionWindow is DuplicateDetectionHistoryTimeWindow.
	DuplicateDetectionWindow time.Duration
	// LockDuration is the peek-lock duration.
	LockDuration time.Duration
	// MaxDeliveryCount is the delivery count at which a message is
	// dead-lettered.
	MaxDeliveryCount int
	// MaxMessageBytes is the largest message body accepted.
	MaxMessageBytes int
}

// DeadLetter is one dead-lettered message as the double recorded it.
type DeadLetter struct {
	MessageID   string `json:"messageId"`
	Reason      string `json:"reason"`
	Description string `json:"description"`
}

// dir is the folder holding start.mjs and node_modules: this file's own.
func dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

// Start starts the double on free ports, or returns why it cannot run here
// (node or the npm package missing).
func Start() (*Double, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, errors.New("node is not installed")
	}
	d := dir()
	if _, err := os.Stat(filepath.Join(d, "node_modules", "rhea", "package.json")); err != nil {
		return nil, errors.New("rhea is not installed: run `npm ci --prefix localstack/servicebus-double` in the repository root")
	}
	cmd := exec.Command(node, "start.mjs")
	cmd.Dir = d
	cmd.Env = append(os.Environ(), "DOUBLE_PORT=0")
	// start.mjs exits when its stdin closes, so a double cannot outlive a
	// test binary that is killed.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &syncWriter{w: &stderr}
	if os.Getenv("DOUBLE_DEBUG") != "" {
		// DOUBLE_DEBUG makes start.mjs report its own errors; show them.
		cmd.Stderr = io.MultiWriter(cmd.Stderr, os.Stderr)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the servicebus double: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() error {
		stdin.Close()
		t := time.NewTimer(5 * time.Second)
		defer t.Stop()
		select {
		case <-exited:
			return nil
		case <-t.C:
		}
		_ = cmd.Process.Kill()
		<-exited
		return errors.New("the servicebus double did not stop within 5s; killed")
	}
	type ports struct{ amqp, control int }
	found := make(chan ports, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		re := regexp.MustCompile(`listening on port (\d+) control port (\d+)`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				a, _ := strconv.Atoi(m[1])
				c, _ := strconv.Atoi(m[2])
				found <- ports{a, c}
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	select {
	case p := <-found:
		return &Double{Port: p.amqp, ControlURL: fmt.Sprintf("http://127.0.0.1:%d", p.control), stop: stop}, nil
	case err := <-exited:
		exited <- err
		stop()
		return nil, fmt.Errorf("the servicebus double exited at start (%v): %s", err, stderr.String())
	case <-deadline.C:
		stop()
		return nil, fmt.Errorf("the servicebus double printed no port within 30s: %s", stderr.String())
	}
}

// Stop stops the double.
func (d *Double) Stop() error { return d.stop() }

// ConnectionString is an azservicebus connection string for the double.
// The key is a placeholder: the double accepts any token.
func (d *Double) ConnectionString() string {
	return fmt.Sprintf("Endpoint=sb://127.0.0.1:%d;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true", d.Port)
}

// CreateQueue creates (or replaces) a queue.
func (d *Double) CreateQueue(ctx context.Context, name string, cfg QueueConfig) error {
	body := map[string]any{"requiresDuplicateDetection": cfg.RequiresDuplicateDetection}
	if cfg.DuplicateDetectionWindow > 0 {
		body["duplicateDetectionMs"] = cfg.DuplicateDetectionWindow.Milliseconds()
	}
	if cfg.LockDuration > 0 {
		body["lockMs"] = cfg.LockDuration.Milliseconds()
	}
	if cfg.MaxDeliveryCount > 0 {
		body["maxDeliveryCount"] = cfg.MaxDeliveryCount
	}
	if cfg.MaxMessageBytes > 0 {
		body["maxMessageBytes"] = cfg.MaxMessageBytes
	}
	return d.call(ctx, http.MethodPut, "/entities/"+url.PathEscape(name), body, nil)
}

// DeleteQueue deletes a queue; its locked and waiting messages are gone.
func (d *Double) DeleteQueue(ctx context.Context, name string) error {
	return d.call(ctx, http.MethodDelete, "/entities/"+url.PathEscape(name), nil, nil)
}

// DeadLetters lists the messages the queue dead-lettered so far.
func (d *Double) DeadLetters(ctx context.Context, name string) ([]DeadLetter, error) {
	var out []DeadLetter
	err := d.call(ctx, http.MethodGet, "/entities/"+url.PathEscape(name)+"/deadletters", nil, &out)
	return out, err
}

func (d *Double) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, d.ControlURL+path, body)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("servicebus double: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("servicebus double: %s %s: HTTP %d: %s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
