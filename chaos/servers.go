package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dedupq/dedupq/internal/natsbin"
)

// procs tracks every process the run started, so that all of them are
// stopped, by PID, however the run ends.
type procs struct {
	mu  sync.Mutex
	all map[*proc]bool
}

// proc is one started process.
type proc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // valid once exited is closed
}

// spec says how to start a process.
type spec struct {
	path   string
	args   []string
	env    []string
	cred   *syscall.Credential
	stdout io.Writer
	stderr io.Writer
}

// start starts s. The process gets SIGKILL if this one dies first, so
// that a run killed itself leaves no server or child behind.
func (ps *procs) start(name string, s spec) (*proc, error) {
	cmd := exec.Command(s.path, s.args...)
	cmd.Env = append(os.Environ(), s.env...)
	cmd.Stdout, cmd.Stderr = s.stdout, s.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: s.cred}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{})}
	ps.mu.Lock()
	if ps.all == nil {
		ps.all = map[*proc]bool{}
	}
	ps.all[p] = true
	ps.mu.Unlock()
	go func() {
		p.err = cmd.Wait()
		ps.mu.Lock()
		delete(ps.all, p)
		ps.mu.Unlock()
		close(p.exited)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) done() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// stop sends sig and waits up to grace for the process to exit, then
// kills it. It reports whether it exited within grace.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) bool {
	_ = p.cmd.Process.Signal(sig)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
		return true
	case <-t.C:
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	return false
}

// stopAll stops every process still running: SIGTERM, then SIGKILL after
// 10s.
func (ps *procs) stopAll() {
	ps.mu.Lock()
	var all []*proc
	for p := range ps.all {
		all = append(all, p)
	}
	ps.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range all {
		wg.Go(func() { p.stop(syscall.SIGTERM, 10*time.Second) })
	}
	wg.Wait()
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// server is a private server the run may restart: started again with the
// same spec, on the same port and data.
type server struct {
	name  string
	procs *procs
	spec  spec
	port  int
	// ready reports whether the server answers.
	ready func(ctx context.Context) error
	// crash is the signal of a restart fault: SIGKILL for a server that
	// must survive a crash, SIGQUIT for PostgreSQL's immediate shutdown
	// (a crash without orphaned backends).
	crash   syscall.Signal
	forgets bool
	p       *proc
}

func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// restarter is a server fault: a crash and start of a server process, or
// a broker cut off (cutProxy).
type restarter interface {
	restart(ctx context.Context, downtime time.Duration) (outage, error)
	describe() string
}

func (s *server) describe() string { return fmt.Sprintf("pid %d, %v", s.p.pid(), s.crash) }

// start starts the server and waits, at most 30s, until it answers.
func (s *server) start(ctx context.Context) error {
	p, err := s.procs.start(s.name, s.spec)
	if err != nil {
		return err
	}
	s.p = p
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		err := s.ready(ctx)
		if err == nil {
			return nil
		}
		if p.done() {
			return fmt.Errorf("%s exited at start: %v", s.name, p.err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready within 30s: %w", s.name, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// restart stops the server with its crash signal, keeps it down for
// downtime, and starts it again.
func (s *server) restart(ctx context.Context, downtime time.Duration) (outage, error) {
	o := outage{server: s.name, start: time.Now(), forgets: s.forgets}
	if !s.p.stop(s.crash, 20*time.Second) {
		return o, fmt.Errorf("%s did not stop on %v within 20s; killed", s.name, s.crash)
	}
	select {
	case <-time.After(downtime):
	case <-ctx.Done():
		return o, ctx.Err()
	}
	err := s.start(ctx)
	o.end = time.Now()
	return o, err
}

// tcpReady reports whether the port accepts connections.
func tcpReady(addr string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
}

// newNATS is a nats-server with JetStream storing in dir: the release
// go.mod requires (the one the embedded server runs), which natsbin
// builds once per machine. Its restart fault is SIGKILL, a crash: the
// server writes a single-replica stream's message to its file before it
// acknowledges the publish, and a process crash loses no write made (the
// kernel keeps it; only a machine crash loses what was not yet fsynced).
// It was SIGTERM, a clean restart, while this ran Debian's 2.9.10; the
// tests on the shared server at 127.0.0.1:4222 keep covering that release.
func newNATS(ctx context.Context, ps *procs, dir string, log io.Writer) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	bin, err := natsbin.Path(ctx)
	if err != nil {
		return nil, err
	}
	s := &server{name: "nats", procs: ps, port: port, crash: syscall.SIGKILL}
	s.spec = spec{path: bin, args: []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", filepath.Join(dir, "nats")}, stdout: log, stderr: log}
	s.ready = tcpReady(s.addr())
	return s, nil
}

// newRedis is a redis-server in dir. With persist it writes every change
// to its append-only file before answering (appendfsync always), so a
// SIGKILL loses nothing it acknowledged; without, it keeps nothing across
// a restart. Its restart fault is SIGKILL.
func newRedis(ps *procs, dir string, persist bool, log io.Writer) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	bin, err := lookPath("redis-server", "/usr/bin/redis-server")
	if err != nil {
		return nil, err
	}
	rdir := filepath.Join(dir, "redis")
	if err := os.MkdirAll(rdir, 0o755); err != nil {
		return nil, err
	}
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", rdir, "--save", "", "--daemonize", "no"}
	if persist {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	s := &server{name: "redis", procs: ps, port: port, crash: syscall.SIGKILL, forgets: !persist}
	s.spec = spec{path: bin, args: args, stdout: log, stderr: log}
	s.ready = tcpReady(s.addr())
	return s, nil
}

// newPostgres initdbs a private PostgreSQL cluster in dir and returns it
// unstarted. As root, initdb and postgres run as the postgres user, which
// they require. Its restart fault is SIGQUIT, an immediate shutdown: no
// checkpoint, crash recovery at the next start. fsync is off, which a
// process crash cannot tell from on (the kernel keeps what was written);
// only a machine crash could.
func newPostgres(ctx context.Context, ps *procs, dir string, log io.Writer) (*server, error) {
	initdb, err := pgBin("initdb")
	if err != nil {
		return nil, err
	}
	postgres, err := pgBin("postgres")
	if err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "pg")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return nil, err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("postgres must run as a user other than root, and there is no postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(data, uid, gid); err != nil {
			return nil, err
		}
	}
	p, err := ps.start("initdb", spec{path: initdb, args: []string{"-D", data, "-A", "trust", "-U", "postgres", "--no-sync"}, cred: cred, stdout: log, stderr: log})
	if err != nil {
		return nil, err
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
		p.stop(syscall.SIGKILL, time.Second)
		return nil, ctx.Err()
	}
	if p.err != nil {
		return nil, fmt.Errorf("initdb: %w (its output is in the run's log)", p.err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &server{name: "pg", procs: ps, port: port, crash: syscall.SIGQUIT}
	s.spec = spec{path: postgres, args: []string{
		"-D", data, "-p", strconv.Itoa(port), "-c", "listen_addresses=127.0.0.1", "-k", data,
		"-c", "fsync=off", "-c", "max_connections=300", "-c", "shared_buffers=64MB",
	}, cred: cred, stdout: log, stderr: log}
	s.ready = func(ctx context.Context) error {
		c, err := pgx.Connect(ctx, s.dsn())
		if err != nil {
			return err
		}
		return c.Close(ctx)
	}
	return s, nil
}

func (s *server) dsn() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// pgBin finds a PostgreSQL program: on PATH, else in pg_config's bindir,
// else in the newest /usr/lib/postgresql/*/bin.
func pgBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		p := filepath.Join(string(trimNL(out)), name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	if len(matches) > 0 {
		return matches[len(matches)-1], nil
	}
	return "", fmt.Errorf("%s: %w", name, errMissing)
}

// errMissing marks a server program this machine does not have: the one
// reason the CI test may skip outside CI.
var errMissing = errors.New("not installed")

func lookPath(name, fallback string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	if _, err := os.Stat(fallback); err == nil {
		return fallback, nil
	}
	return "", fmt.Errorf("%s: %w", name, errMissing)
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
