package embedded

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/dedupq/dedupq/adapters/jetstream/internal/inprocess"
)

// The lifetime the package doc states is two choices. Counting references
// alone would give each restart an empty store, so that a consumer opened
// after its publisher closed would find nothing; a server running from the
// first open to Shutdown would leave its goroutines to every program that
// does not call it. Together they cost a restart, tens of milliseconds,
// where a program closes everything and opens again.

// shared is the process's one registration, as database/sql keeps its
// drivers; its state changes only under its lock.
var shared = newProcessServer()

func init() { inprocess.Register(shared) }

// processServer is the server the jetstream adapter acquires for
// jetstream://embedded/… URLs.
type processServer struct {
	// lock is held while the fields below are read or changed, a start and
	// a stop included: concurrent first opens start one server. It is a
	// channel so that an Acquire waiting for it honours its context.
	lock chan struct{}
	srv  *server.Server // nil while stopped
	refs int            // unreleased acquisitions of srv
	dir  string         // store directory, created by the first start, removed by Shutdown
	// starts counts the servers started, for tests.
	starts int
}

func newProcessServer() *processServer {
	return &processServer{lock: make(chan struct{}, 1)}
}

// Acquire implements inprocess.Server.
func (p *processServer) Acquire(ctx context.Context) (nats.Option, func(), error) {
	select {
	case p.lock <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("embedded: waiting for the in-process server: %w", ctx.Err())
	}
	defer func() { <-p.lock }()
	if p.srv == nil {
		if p.dir == "" {
			dir, err := os.MkdirTemp("", "dedupq-embedded-*")
			if err != nil {
				return nil, nil, fmt.Errorf("embedded: creating a store directory: %w", err)
			}
			p.dir = dir
		}
		s, err := start(ctx, &server.Options{DontListen: true, StoreDir: p.dir})
		if err != nil {
			return nil, nil, err
		}
		p.srv = s
		p.starts++
	}
	p.refs++
	s := p.srv
	return nats.InProcessServer(s), sync.OnceFunc(func() { p.release(s) }), nil
}

// release gives back one acquisition of s, and stops s when it was the
// last. An acquisition of a server that Shutdown stopped gives back
// nothing.
func (p *processServer) release(s *server.Server) {
	p.lock <- struct{}{}
	defer func() { <-p.lock }()
	if p.srv != s {
		return
	}
	if p.refs--; p.refs == 0 {
		shutdown(s)
		p.srv = nil
	}
}

// Shutdown stops the server that jetstream://embedded/… URLs name, if it
// runs, and removes its store directory: every stream on it is gone, and
// the next open starts an empty server. It returns once the server has
// stopped; ctx bounds only the wait for an open or close in progress.
//
// A program calls it at its end, deferred in main, so that the temporary
// directory does not outlive the process. A Publisher or Consumer still
// open on the server when it stops fails from then on (its connection
// tries in vain to reconnect until closed); close them first.
func Shutdown(ctx context.Context) error {
	return shared.shutdown(ctx)
}

func (p *processServer) shutdown(ctx context.Context) error {
	select {
	case p.lock <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("embedded: waiting for the in-process server: %w", ctx.Err())
	}
	defer func() { <-p.lock }()
	if p.srv != nil {
		shutdown(p.srv)
		p.srv, p.refs = nil, 0
	}
	if p.dir == "" {
		return nil
	}
	dir := p.dir
	p.dir = ""
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("embedded: removing the store directory: %w", err)
	}
	return nil
}
