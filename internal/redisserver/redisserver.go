// Package redisserver starts private redis-server processes, alone or as a
// Redis Cluster, on loopback ports of their own, for tests and fault
// programs that must kill a server without touching the machine's shared
// Redis. Each server runs as a child process in a directory the caller
// owns, without persistence, and is stopped by its PID.
package redisserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrMissing reports that redis-server or redis-cli is not installed.
var ErrMissing = errors.New("redisserver: redis-server or redis-cli not found in PATH")

// Installed reports whether redis-server and redis-cli are in PATH,
// wrapping ErrMissing when not.
func Installed() error {
	for _, name := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(name); err != nil {
			return fmt.Errorf("%w: %w", ErrMissing, err)
		}
	}
	return nil
}

// Server is one running redis-server.
type Server struct {
	// Addr is host:port of its client port.
	Addr string
	// BusPort is its cluster bus port, 0 when not in cluster mode.
	BusPort int
	dir     string
	cmd     *exec.Cmd
	exited  chan struct{}
	once    sync.Once
}

// startTimeout bounds how long a server or cluster may take to be ready:
// about a second is usual, the rest is for a loaded machine.
const startTimeout = 30 * time.Second

// Start runs redis-server on a free loopback port with dir as its working
// directory (created if missing), no persistence, and args appended to its
// command line, and returns once it answers.
func Start(ctx context.Context, dir string, args ...string) (*Server, error) {
	return start(ctx, dir, false, args)
}

func start(ctx context.Context, dir string, cluster bool, args []string) (*Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// A probed port can be taken by someone else before the server binds
	// it; the server then exits at once and another pair is tried.
	var lastErr error
	for range 5 {
		s, err := startOnce(ctx, dir, cluster, args)
		if err == nil {
			return s, nil
		}
		lastErr = err
		if !strings.Contains(err.Error(), "already in use") {
			break
		}
	}
	return nil, lastErr
}

func startOnce(ctx context.Context, dir string, cluster bool, args []string) (*Server, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	argv := []string{
		"--port", strconv.Itoa(ports[0]), "--bind", "127.0.0.1",
		"--dir", dir, "--logfile", filepath.Join(dir, "log"),
		"--save", "", "--appendonly", "no", "--daemonize", "no",
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), dir: dir, exited: make(chan struct{})}
	if cluster {
		s.BusPort = ports[1]
		argv = append(argv, "--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(ports[1]),
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"))
	}
	// A previous try's identity and log.
	_ = os.Remove(filepath.Join(dir, "nodes.conf"))
	_ = os.Remove(filepath.Join(dir, "log"))
	s.cmd = exec.Command("redis-server", append(argv, args...)...)
	dieWithParent(s.cmd)
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		select {
		case <-s.exited:
			return false, fmt.Errorf("redisserver: redis-server on %s exited at start: %s", s.Addr, s.LogTail())
		default:
		}
		// Dial first: go-redis logs every connection it cannot make.
		conn, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err != nil {
			return false, nil
		}
		_ = conn.Close()
		// Ask for the PID: a server that lost the port to another
		// one may not have exited yet, and the other must not be taken
		// for it.
		c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialerRetries: 1, DialTimeout: time.Second})
		defer c.Close()
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			return false, nil
		}
		if !strings.Contains(info, "process_id:"+strconv.Itoa(s.PID())+"\r") {
			return false, fmt.Errorf("redisserver: %s already in use by another server", s.Addr)
		}
		return true, nil
	})
	if err != nil {
		s.Kill()
		return nil, err
	}
	return s, nil
}

// freePorts returns n loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// poll calls cond until it holds, fails, or ctx or startTimeout ends.
func poll(ctx context.Context, cond func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		ok, err := cond(ctx)
		if err != nil || ok {
			return err
		}
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("redisserver: not ready within %s: %w", startTimeout, ctx.Err())
		case <-t.C:
		}
	}
}

// PID is the server's process ID.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Kill sends SIGKILL to the server's PID, as a crash would, and waits for
// it to exit. Killing a server that already exited does nothing.
func (s *Server) Kill() {
	s.once.Do(func() {
		_ = s.cmd.Process.Kill()
		<-s.exited
	})
}

// Exited is closed once the server's process has exited.
func (s *Server) Exited() <-chan struct{} { return s.exited }

// LogTail is the end of the server's log, for failure messages.
func (s *Server) LogTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

// ClusterOptions shape a cluster.
type ClusterOptions struct {
	// Masters is the number of masters, 3 when 0 (the fewest redis-cli
	// accepts).
	Masters int
	// ReplicasPerMaster is how many replicas each master gets.
	ReplicasPerMaster int
	// NodeTimeout is cluster-node-timeout: how long a node may not answer
	// before the others mark it failed and, with replicas, fail it over.
	// 0 leaves Redis's default (15 s).
	NodeTimeout time.Duration
	// Args are appended to every node's command line.
	Args []string
}

// Cluster is a running Redis Cluster.
type Cluster struct {
	// Nodes are the servers, in the order given to redis-cli, which
	// makes the first Masters of them masters (on one host); a failover
	// changes the roles, not this order.
	Nodes []*Server
	// Masters is how many of Nodes were created as masters.
	Masters int
}

// StartCluster starts the nodes in subdirectories of dir, joins them with
// `redis-cli --cluster create`, and returns once every node reports
// cluster_state:ok, knows every other node, and every replica's link to
// its master is up. On error it stops whatever it started.
func StartCluster(ctx context.Context, dir string, o ClusterOptions) (c *Cluster, err error) {
	if err := Installed(); err != nil {
		return nil, err
	}
	if o.Masters == 0 {
		o.Masters = 3
	}
	// A replica's first sync starts at once instead of after the
	// default 5 s wait for more replicas to share it.
	args := append([]string{"--repl-diskless-sync-delay", "0"}, o.Args...)
	if o.NodeTimeout > 0 {
		args = append(args, "--cluster-node-timeout", strconv.FormatInt(o.NodeTimeout.Milliseconds(), 10))
	}
	c = &Cluster{Masters: o.Masters}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	n := o.Masters * (1 + o.ReplicasPerMaster)
	c.Nodes = make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { c.Nodes[i], errs[i] = start(ctx, filepath.Join(dir, strconv.Itoa(i)), true, args) })
	}
	wg.Wait()
	c.Nodes = slices.DeleteFunc(c.Nodes, func(s *Server) bool { return s == nil })
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// redis-cli makes the first Masters addresses masters and gives each
	// replicas from the rest.
	create := append([]string{"--cluster", "create"}, c.Addrs()...)
	create = append(create, "--cluster-replicas", strconv.Itoa(o.ReplicasPerMaster), "--cluster-yes")
	cmd := exec.CommandContext(ctx, "redis-cli", create...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redisserver: redis-cli --cluster create: %w: %s", err, out)
	}
	err = poll(ctx, func(ctx context.Context) (bool, error) {
		for _, s := range c.Nodes {
			ok, err := s.clusterReady(ctx, n)
			if err != nil || !ok {
				return false, err
			}
		}
		return true, nil
	})
	return c, err
}

// clusterReady reports whether s sees the whole cluster up.
func (s *Server) clusterReady(ctx context.Context, nodes int) (bool, error) {
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialerRetries: 1})
	defer rdb.Close()
	info, err := rdb.ClusterInfo(ctx).Result()
	if err != nil {
		return false, nil
	}
	f := fields(info)
	if f["cluster_state"] != "ok" || f["cluster_known_nodes"] != strconv.Itoa(nodes) {
		return false, nil
	}
	repl, err := rdb.Info(ctx, "replication").Result()
	if err != nil {
		return false, nil
	}
	r := fields(repl)
	return r["role"] == "master" || r["master_link_status"] == "up", nil
}

// fields parses the key:value lines of CLUSTER INFO and INFO.
func fields(s string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), ":"); ok {
			m[k] = v
		}
	}
	return m
}

// State is the cluster_state that node i reports in CLUSTER INFO ("ok",
// "fail").
func (c *Cluster) State(ctx context.Context, i int) (string, error) {
	rdb := redis.NewClient(&redis.Options{Addr: c.Nodes[i].Addr, MaxRetries: -1, DialerRetries: 1})
	defer rdb.Close()
	info, err := rdb.ClusterInfo(ctx).Result()
	if err != nil {
		return "", err
	}
	return fields(info)["cluster_state"], nil
}

// Addrs are the nodes' client addresses, in the order of Nodes.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, s := range c.Nodes {
		a = append(a, s.Addr)
	}
	return a
}

// Node returns the node listening on addr, or nil.
func (c *Cluster) Node(addr string) *Server {
	for _, s := range c.Nodes {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// Close kills every node by its PID and waits for it to exit.
func (c *Cluster) Close() {
	for _, s := range c.Nodes {
		s.Kill()
	}
}
