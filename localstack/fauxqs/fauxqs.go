// Package fauxqs starts the fauxqs SQS emulator (an npm package, installed
// next to this file from package-lock.json with `npm ci`, which Start runs
// itself when node_modules is missing) for tests that need SQS without AWS
// or Docker.
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
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"time"

	"github.com/dedupq/dedupq/localstack/internal/nodeproc"
)

// EnvEndpoint names the environment variable that points the tests at an
// emulator that is already running (fauxqs, or LocalStack from
// ../docker-compose.yml) instead of starting one.
const EnvEndpoint = "FAUXQS_ENDPOINT"

// ErrUnavailable is wrapped by Start's error when fauxqs cannot run on
// this machine (node, or npm for its install, is missing): the one reason
// a test may skip, outside CI.
var ErrUnavailable = nodeproc.ErrUnavailable

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

// Start starts fauxqs on a free port and waits until it answers,
// installing it from package-lock.json first if needed, or returns why it
// cannot (wrapping ErrUnavailable when node or npm is missing).
func Start() (*Emulator, error) {
	if ep := os.Getenv(EnvEndpoint); ep != "" {
		if err := WaitReady(ep, 10*time.Second); err != nil {
			return nil, fmt.Errorf("%s=%s: %w", EnvEndpoint, ep, err)
		}
		return &Emulator{Endpoint: ep}, nil
	}
	return StartWith(Options{})
}

// Options are for an emulator of the caller's own (StartWith).
type Options struct {
	// Port is the port to listen on; 0 picks a free one.
	Port int
	// Init is the path of a fauxqs init file (JSON: {"queues": [{"name":
	// …, "attributes": {…}}]}) whose queues exist before the emulator
	// answers its first request. fauxqs keeps everything in memory, so a
	// test that restarts it passes the queues it must find again.
	Init string
}

// StartWith starts a fauxqs of the caller's own, whatever EnvEndpoint
// says: tests that stop the emulator and start it again on the same port
// use it.
func StartWith(o Options) (*Emulator, error) {
	env := []string{"FAUXQS_PORT=" + strconv.Itoa(o.Port)}
	if o.Init != "" {
		env = append(env, "FAUXQS_INIT="+o.Init)
	}
	proc, ports, err := nodeproc.Start(nodeproc.Spec{
		Name: "fauxqs", Dir: dir(), Script: "start.mjs", Module: "fauxqs",
		Env: env, Ready: regexp.MustCompile(`listening on port (\d+)`),
	})
	if err != nil {
		return nil, err
	}
	stop := proc.Stop
	endpoint := "http://127.0.0.1:" + ports[0]
	if err := WaitReady(endpoint, 15*time.Second); err != nil {
		stop()
		return nil, fmt.Errorf("fauxqs at %s: %w", endpoint, err)
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
