package natsbin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// Start runs the nats-server of Path with JetStream storing in dir, on a
// loopback port the server picks, and returns its client URL once it
// accepts clients. stop SIGKILLs it and waits for it to exit; on Linux the
// kernel also kills it when the calling process dies first. ctx bounds the
// build (see Path) and the start.
func Start(ctx context.Context, dir string) (url string, stop func(), err error) {
	bin, err := Path(ctx)
	if err != nil {
		return "", nil, err
	}
	// -p -1: the server picks a free port and writes it to the ports
	// file, so no other process can take it between a probe and the bind.
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", "-1", "-js", "-sd", filepath.Join(dir, "js"), "--ports_file_dir", dir)
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("natsbin: starting %s: %w", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop = func() {
		_ = cmd.Process.Kill()
		<-exited
	}
	// The server names the file after its program and PID.
	file := filepath.Join(dir, filepath.Base(bin)+"_"+strconv.Itoa(cmd.Process.Pid)+".ports")
	for {
		if b, err := os.ReadFile(file); err == nil {
			var ports struct{ Nats []string }
			if json.Unmarshal(b, &ports) == nil && len(ports.Nats) > 0 {
				return ports.Nats[0], stop, nil
			}
		}
		select {
		case err := <-exited:
			exited <- err
			stop()
			return "", nil, fmt.Errorf("natsbin: nats-server exited at start: %w", errors.Join(err, errors.New("no ports file")))
		case <-ctx.Done():
			stop()
			return "", nil, fmt.Errorf("natsbin: nats-server wrote no ports file: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
