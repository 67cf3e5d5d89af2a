// Package servicebusdouble starts the Service Bus test double (start.mjs: an
// AMQP 1.0 broker written with the npm package rhea, installed next to this
// file from package-lock.json with `npm ci`, which Start runs itself when
// node_modules is missing) for tests that need Service Bus without Azure
// or Docker. The azservicebus SDK reaches it through
// ConnectionString, which sets UseDevelopmentEmulator=true (plain AMQP).
//
// The double is only as true as what it models; start.mjs's header lists
// what it does and does not. In short: queues only (partitioned or not,
// with sessions or without), no management (HTTP/ATOM) API — queues are
// created through this package (CreateQueue), and entity properties reach
// the adapter through its seam.
package servicebusdouble

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"time"

	"github.com/dedupq/dedupq/localstack/internal/nodeproc"
)

// ErrUnavailable is wrapped by Start's error when the double cannot run on
// this machine (node, or npm for its install, is missing): the one reason
// a test may skip, outside CI.
var ErrUnavailable = nodeproc.ErrUnavailable

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
	// EnablePartitioning makes the queue partitioned: a batch transfer
	// must share one SessionId and PartitionKey (and, with duplicate
	// detection, one MessageId), and duplicate detection is per
	// partition key.
	EnablePartitioning bool
	// RequiresSession makes the queue a session entity: every message
	// must carry a SessionId, and receivers accept a session (the next
	// available one, or one by name) and get its messages only, in order,
	// under the session's lock.
	RequiresSession bool
	// MaxBatchBytes, when set, is the link's
	// com.microsoft:max-message-batch-size (1 MB on Premium, whose
	// MaxMessageBytes may be up to 100 MB): the bound of a batch transfer,
	// while a single message is bounded by MaxMessageBytes only.
	MaxBatchBytes int
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

// Start starts the double on free ports, installing it from
// package-lock.json first if needed, or returns why it cannot (wrapping
// ErrUnavailable when node or npm is missing).
func Start() (*Double, error) { return StartWith(Options{}) }

// Options are for StartWith.
type Options struct {
	// Port is the AMQP port; 0 picks a free one. The control port is
	// always a free one.
	Port int
	// Queues are created before the double accepts a connection. The
	// double keeps everything in memory, so a test that stops it and
	// starts it again on the same port passes the queues it must find.
	Queues map[string]QueueConfig
}

// StartWith starts the double with options: tests that restart it where
// the SDK reconnects use it.
func StartWith(o Options) (*Double, error) {
	queues := make(map[string]any, len(o.Queues))
	for name, cfg := range o.Queues {
		queues[name] = queueBody(cfg)
	}
	entities, err := json.Marshal(queues)
	if err != nil {
		return nil, err
	}
	var stderr io.Writer
	if os.Getenv("DOUBLE_DEBUG") != "" {
		// DOUBLE_DEBUG makes start.mjs report its own errors; show them.
		stderr = os.Stderr
	}
	proc, ports, err := nodeproc.Start(nodeproc.Spec{
		Name: "the servicebus double", Dir: dir(), Script: "start.mjs", Module: "rhea",
		Env: []string{"DOUBLE_PORT=" + strconv.Itoa(o.Port), "DOUBLE_ENTITIES=" + string(entities)}, Stderr: stderr,
		Ready: regexp.MustCompile(`listening on port (\d+) control port (\d+)`),
	})
	if err != nil {
		return nil, err
	}
	amqp, _ := strconv.Atoi(ports[0])
	return &Double{Port: amqp, ControlURL: "http://127.0.0.1:" + ports[1], stop: proc.Stop}, nil
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
	return d.call(ctx, http.MethodPut, "/entities/"+url.PathEscape(name), queueBody(cfg), nil)
}

// queueBody is cfg as the double's control API takes it.
func queueBody(cfg QueueConfig) map[string]any {
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
	if cfg.EnablePartitioning {
		body["enablePartitioning"] = true
	}
	if cfg.MaxBatchBytes > 0 {
		body["maxBatchBytes"] = cfg.MaxBatchBytes
	}
	if cfg.RequiresSession {
		body["requiresSession"] = true
	}
	return body
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
