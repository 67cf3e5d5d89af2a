package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
)

// cutProxy stands between the children and a broker that cannot be
// restarted without losing its messages (fauxqs keeps everything in
// memory; an SQS queue never loses them). Its fault cuts the broker off:
// every connection is reset and new ones are refused for the downtime,
// which is what the clients see of a broker restart, while the broker
// keeps its messages and runs its visibility timeouts meanwhile.
type cutProxy struct {
	target string
	addr   string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// startCutProxy listens on a free loopback port and forwards every
// connection to target.
func startCutProxy(target string) (*cutProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &cutProxy{target: target, addr: ln.Addr().String(), conns: map[net.Conn]bool{}}
	p.serve(ln)
	return p, nil
}

func (p *cutProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.forward(c) })
		}
	})
}

func (p *cutProxy) forward(c net.Conn) {
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(c, up) {
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
	p.untrack(c, up)
	<-done
}

// track registers a connection pair, unless a cut has begun since it was
// accepted: then it closes both.
func (p *cutProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		for _, c := range cs {
			reset(c)
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = true
	}
	return true
}

func (p *cutProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		reset(c)
		delete(p.conns, c)
	}
}

// reset closes c with a TCP reset, as a crashed server's kernel would.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// cut closes the listener and resets every connection.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		reset(c)
		delete(p.conns, c)
	}
}

// restart cuts the broker off for downtime and lets the clients in again
// on the same address.
func (p *cutProxy) restart(ctx context.Context, downtime time.Duration) (outage, error) {
	o := outage{server: "sqs", start: time.Now()}
	p.cut()
	select {
	case <-time.After(downtime):
	case <-ctx.Done():
		return o, ctx.Err()
	}
	// The port was ours a moment ago; another process may take it in
	// between, which is rare enough to fail the run rather than move.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err := net.Listen("tcp", p.addr)
		if err == nil {
			p.serve(ln)
			o.end = time.Now()
			return o, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return o, fmt.Errorf("listening again on %s: %w", p.addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *cutProxy) describe() string { return "a cut of every connection to fauxqs" }

// close stops the proxy and waits for its goroutines.
func (p *cutProxy) close() {
	p.cut()
	p.wg.Wait()
}
