// Package embedded runs a NATS server with JetStream inside the calling
// process, so that a program using dedupq's jetstream adapter can run with
// no services at all: in a demo, a test, or a single-binary deployment that
// does not need a cluster.
//
// Importing it, even only for its side effect,
//
//	import _ "github.com/dedupq/dedupq/adapters/jetstream/embedded"
//
// makes the URL host "embedded" name a server shared by the whole process:
//
//	dedupq.OpenPublisher(ctx, "jetstream://embedded/ORDERS?subject=orders&create=true", opts)
//
// Run and Start instead start a server of the caller's own, on a port.
//
// It lives in its own package so that the NATS server, which is large, is
// linked only into programs that import it; the adapter itself needs only
// the client.
//
// # The shared server
//
// The first open of a jetstream://embedded/… URL starts the server; every
// Publisher and Consumer on it holds it, and closing the last one shuts it
// down, so that a program that closed everything runs none of its
// goroutines. Its store directory, a new temporary one per process,
// outlives those stops: a consumer opened after the publisher closed finds
// the streams, their messages, the dedup history of their windows and the
// durables' positions, as on a server that runs on its own. Only streams
// created with storage=memory end with each stop. Shutdown removes the
// directory; a program that never calls it leaves the directory behind, as
// it would any temporary file it does not remove.
//
// The server listens on no port: clients reach it through in-process
// connections, so nothing outside the process can.
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
	s, err := start(ctx, &server.Options{
		Host:       host,
		Port:       port,
		StoreDir:   dir,
		MaxPayload: o.MaxPayload,
	})
	if err != nil {
		cleanup()
		return "", nil, err
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			shutdown(s)
			cleanup()
		})
	}
	return s.ClientURL(), stop, nil
}

// start runs a JetStream server on opts, which set where it listens and
// stores, and waits until it takes connections. ctx bounds the wait.
func start(ctx context.Context, opts *server.Options) (*server.Server, error) {
	opts.ServerName = "dedupq-embedded"
	opts.JetStream = true
	opts.NoLog = true
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: %w", err)
	}
	go s.Start()
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
			shutdown(s)
			return nil, fmt.Errorf("embedded: server not ready: %w", err)
		}
	}
	return s, nil
}

// shutdown stops s and waits until it has.
func shutdown(s *server.Server) {
	s.Shutdown()
	s.WaitForShutdown()
}
