// Package nodeproc starts the Node.js test emulators kept under localstack/
// (fauxqs, the Service Bus double): each is a script that prints a ready
// line with its port(s) and exits when its standard input closes, so that
// it cannot outlive a test binary that is killed.
package nodeproc

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"sync"
	"time"
)

// Spec says what to start.
type Spec struct {
	// Name is used in errors ("fauxqs").
	Name string
	// Dir holds the script, package-lock.json and node_modules.
	Dir string
	// Script is the file node runs, relative to Dir.
	Script string
	// Module is an npm package that must be installed in Dir.
	Module string
	// Env is added to the environment.
	Env []string
	// Ready matches the stdout line that says the emulator is listening;
	// its submatches are returned.
	Ready *regexp.Regexp
	// Stderr, when set, also receives the script's standard error.
	Stderr io.Writer
}

// Process is a running script.
type Process struct {
	stop func() error
}

// Stop closes the script's standard input and waits for it to exit,
// killing it after 5s.
func (p *Process) Stop() error { return p.stop() }

// Start runs the script and waits, at most 30s, for its ready line. When
// the npm package is not installed it first installs Dir's packages from
// their package-lock.json (`npm ci`, once across parallel test binaries),
// saying so on Stderr or else os.Stderr. Its error wraps ErrUnavailable
// when node, or npm for a needed install, is missing, so that callers can
// skip outside CI.
func Start(s Spec) (*Process, []string, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, nil, fmt.Errorf("%s needs node, which is not on PATH (%w)", s.Name, ErrUnavailable)
	}
	log := s.Stderr
	if log == nil {
		log = os.Stderr
	}
	if _, err := ensureInstalled(s.Dir, s.Module, log); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", s.Name, err)
	}
	cmd := exec.Command(node, s.Script)
	cmd.Dir = s.Dir
	cmd.Env = append(os.Environ(), s.Env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &syncWriter{w: &stderr}
	if s.Stderr != nil {
		cmd.Stderr = io.MultiWriter(cmd.Stderr, s.Stderr)
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("starting %s: %w", s.Name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	p := &Process{stop: func() error {
		stdin.Close()
		t := time.NewTimer(5 * time.Second)
		defer t.Stop()
		select {
		case <-exited:
			return nil
		case <-t.C:
		}
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("%s did not stop within 5s; killed", s.Name)
	}}
	found := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := s.Ready.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1:]
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	select {
	case m := <-found:
		return p, m, nil
	case err := <-exited:
		exited <- err
		p.stop()
		return nil, nil, fmt.Errorf("%s exited at start (%v): %s", s.Name, err, stderr.String())
	case <-deadline.C:
		p.stop()
		return nil, nil, fmt.Errorf("%s printed no ready line within 30s: %s", s.Name, stderr.String())
	}
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
