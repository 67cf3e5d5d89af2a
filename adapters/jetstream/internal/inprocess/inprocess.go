// Package inprocess hands the jetstream adapter the NATS server that
// package embedded runs inside the process. It sits between the two so
// that neither imports the other: the adapter must not link the server,
// which is large, into every program, and embedded cannot import the
// adapter, whose tests import embedded.
package inprocess

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go"
)

// Host is the URL host that names the in-process server, as in
// jetstream://embedded/ORDERS?subject=orders.
const Host = "embedded"

// Server is a NATS server inside the process, shared by every connection
// that names it.
type Server interface {
	// Acquire starts the server unless it runs, and returns the option
	// that connects a client to it and release, which the caller calls
	// once its connection is closed. The server runs while an acquisition
	// is unreleased.
	Acquire(ctx context.Context) (connect nats.Option, release func(), err error)
}

// The registration, as database/sql keeps its drivers: written once by
// package embedded's init, read by every open.
var (
	mu         sync.RWMutex
	registered Server
)

// Register makes s the in-process server. It panics when called twice, as
// database/sql.Register does for a driver name.
func Register(s Server) {
	mu.Lock()
	defer mu.Unlock()
	if registered != nil {
		panic("jetstream: the in-process server is registered twice")
	}
	registered = s
}

// Registered returns the in-process server, or nil when package embedded
// is not linked into the program.
func Registered() Server {
	mu.RLock()
	defer mu.RUnlock()
	return registered
}
