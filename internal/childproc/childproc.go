// Package childproc re-executes the running binary as a helper process that
// serves something (pstest, out of a race-checked or measured process) and
// prints its address as its first line.
package childproc

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Start runs the current executable again with env added to this process's
// environment (env marks the run as the child), and returns the first line
// the child prints, trimmed. stop closes the child's stdin, its signal to
// exit, and waits for it.
func Start(env ...string) (line string, stop func(), err error) {
	exe, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() { stdin.Close(); _ = cmd.Wait() }
	line, err = bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("the child process printed no first line: %w", err)
	}
	return strings.TrimSpace(line), stop, nil
}
