// Package embedded runs a NATS server with JetStream inside the calling
// process, so that a program using dedupq's jetstream adapter can run with
// no services at all: in a demo, a test, or a single-binary deployment that
// does not need a cluster.
//
// It lives in its own package so that the NATS server, which is large, is
// linked only into programs that import it; the adapter itself needs only
// the client.
package embedded

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options tune Start. The zero value runs a file-backed server on a random
// loopback port.
type Options struct {
	// Dir is where JetStream keeps its data. Empty means a new temporary
	// directory, removed again by stop: pass a directory of your own to
	// keep streams, and with them dedup history, across restarts.
	Dir string
	// Host is the address to listen on; empty means 127.0.0.1, so that the
	// server is never reachable from another machine by accident.
	Host string
	// Port is the client port; 0 means a random free port.
	Port int
	// MaxPayload overrides the server's max_payload (1 MiB) when positive.
	MaxPayload int32
}

// Run starts an embedded server storing JetStream data in dir (a new
// temporary directory when dir is empty) and returns its client URL, e.g.
// "nats://127.0.0.1:41234". A dedupq URL is that address with the jetstream
// scheme: "jetstream://127.0.0.1:41234/ORDERS?subject=orders&create=true".
// ctx bounds the start only. Call stop to shut the server down; it waits for
// the shutdown to finish, and may be called more than once.
func Run(ctx context.Context, dir string) (url string, stop func(), err error) {
	return Start(ctx, Options{Dir: dir})
}

// Start is Run with options.
func Start(ctx context.Context, o Options) (url string, stop func(), err error) {
	dir, cleanup := o.Dir, func() {}
	if dir == "" {
		tmp, err := os.MkdirTemp("", "dedupq-nats-*")
		if err != nil {
			return "", nil, fmt.Errorf("embedded: creating a store directory: %w", err)
		}
		dir, cleanup = tmp, func() { _ = os.RemoveAll(tmp) }
	}
	host := o.Host
	if host == "" {
		host = "127.0.0.1"
	}
	port := o.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		ServerName: "dedupq-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		NoLog:      true,
		NoSigs:     true,
		MaxPayload: o.MaxPayload,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("embedded: %w", err)
	}
	go s.Start()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			s.Shutdown()
			s.WaitForShutdown()
			cleanup()
		})
	}
	if _, ok := ctx.Deadline(); !ok {
		// A server that never gets ready must not hang the caller.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	// ReadyForConnections only takes a duration; poll in short steps so
	// that a cancelled ctx is noticed promptly.
	for !s.ReadyForConnections(100 * time.Millisecond) {
		if err := ctx.Err(); err != nil {
			stop()
			return "", nil, fmt.Errorf("embedded: server not ready: %w", err)
		}
	}
	return s.ClientURL(), stop, nil
}
