// Package fauxqs starts the fauxqs SQS emulator (an npm package, installed
// next to this file from package-lock.json with `npm ci --prefix
// localstack/fauxqs`) for tests that need SQS without AWS or Docker.
//
// Where fauxqs differs from AWS:
//   - ReceiveMessage returns at most one message per message group per call
//     (AWS may return several of a group): receive in a loop.
//   - CreateQueue accepts a .fifo name without FifoQueue=true and makes it
//     FIFO (AWS refuses): always pass FifoQueue=true, as on AWS.
//   - A long poll whose HTTP request the client abandoned stays registered
//     until its WaitTimeSeconds ends and takes the next message that
//     arrives, which reappears only after the visibility timeout: use short
//     long polls, or a fresh queue, after cancelling a receive.
//   - DeleteMessageBatch reports success for an unknown receipt handle.
//   - It checks no signatures: any static credentials work.
package fauxqs

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sync"
	"time"
)

// EnvEndpoint names the environment variable that points the tests at an
// emulator that is already running (fauxqs, or LocalStack from
// ../docker-compose.yml) instead of starting one.
const EnvEndpoint = "FAUXQS_ENDPOINT"

// Emulator is a running fauxqs, or one found through EnvEndpoint.
type Emulator struct {
	// Endpoint is the base URL to give the SQS client (BaseEndpoint).
	Endpoint string
	stop     func() error
}

// Stop stops an emulator this package started; one found through
// EnvEndpoint is left running.
func (e *Emulator) Stop() error {
	if e.stop == nil {
		return nil
	}
	return e.stop()
}

// dir is the folder holding start.mjs and node_modules: this file's own.
func dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(file)
}

// Start starts fauxqs on a free port and waits until it answers, or
// returns why it cannot run here (node or the npm package missing).
func Start() (*Emulator, error) {
	if ep := os.Getenv(EnvEndpoint); ep != "" {
		if err := WaitReady(ep, 10*time.Second); err != nil {
			return nil, fmt.Errorf("%s=%s: %w", EnvEndpoint, ep, err)
		}
		return &Emulator{Endpoint: ep}, nil
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, errors.New("node is not installed")
	}
	d := dir()
	if _, err := os.Stat(filepath.Join(d, "node_modules", "fauxqs", "package.json")); err != nil {
		return nil, errors.New("fauxqs is not installed: run `npm ci --prefix localstack/fauxqs` in the repository root")
	}
	cmd := exec.Command(node, "start.mjs")
	cmd.Dir = d
	cmd.Env = append(os.Environ(), "FAUXQS_PORT=0")
	// start.mjs exits when its stdin closes, so an emulator cannot outlive
	// a test binary that is killed.
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
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting fauxqs: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() error {
		stdin.Close()
		select {
		case <-exited:
			return nil
		case <-time.After(5 * time.Second):
		}
		_ = cmd.Process.Kill()
		<-exited
		return errors.New("fauxqs did not stop within 5s; killed")
	}

	ports := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		re := regexp.MustCompile(`listening on port (\d+)`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				ports <- m[1]
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var endpoint string
	select {
	case port := <-ports:
		endpoint = "http://127.0.0.1:" + port
	case err := <-exited:
		exited <- err
		stop()
		return nil, fmt.Errorf("fauxqs exited at start (%v): %s", err, stderr.String())
	case <-time.After(30 * time.Second):
		stop()
		return nil, fmt.Errorf("fauxqs printed no port within 30s: %s", stderr.String())
	}
	if err := WaitReady(endpoint, 15*time.Second); err != nil {
		stop()
		return nil, fmt.Errorf("fauxqs at %s: %w: %s", endpoint, err, stderr.String())
	}
	return &Emulator{Endpoint: endpoint, stop: stop}, nil
}

// WaitReady polls the emulator until it answers an SQS ListQueues call.
func WaitReady(endpoint string, within time.Duration) error {
	deadline := time.Now().Add(within)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := listQueues(endpoint)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %s: %w", within, err)
		}
		<-tick.C
	}
}

// listQueues makes one unsigned ListQueues call in SQS's JSON protocol;
// the emulator checks no signatures.
func listQueues(endpoint string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader([]byte("{}")))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Target", "AmazonSQS.ListQueues")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("ListQueues: HTTP %d", resp.StatusCode)
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
