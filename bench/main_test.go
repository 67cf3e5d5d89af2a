// Runs the benchmark program in quick mode on the in-memory broker and
// store only (no server), so that CI keeps it compiling and working.
package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestQuickMemory(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-quick", "-only", "mem,memstore"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"Machine: ",
		"| mem | publish 1 KiB | 1 | driver SendBatch |",
		"| mem | consume+guard | 64 | driver Receive+Ack |",
		"| memstore | claim+complete | 64 | map set-if-absent |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestUnknownGroup(t *testing.T) {
	err := run(context.Background(), []string{"-only", "nope"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), `unknown group "nope"`) {
		t.Fatalf("got %v, want an unknown group error", err)
	}
}
