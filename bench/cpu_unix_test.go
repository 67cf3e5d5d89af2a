//go:build unix

// The CPU columns, read from getrusage: no services.
package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
)

// TestCPUColumns checks that both sides of a row report the CPU time their
// messages took: a column stuck at 0 would read as free work.
func TestCPUColumns(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-quick", "-only", "mem"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	var header, row []string
	for line := range strings.SplitSeq(out.String(), "\n") {
		cells := strings.Split(line, "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch {
		case strings.HasPrefix(line, "| group |"):
			header = cells
		case strings.HasPrefix(line, "| mem | consume | 64 |"):
			row = cells
		}
	}
	if header == nil || row == nil || len(row) != len(header) {
		t.Fatalf("no header or mem consume row of the same width:\n%s", out.String())
	}
	for _, col := range []string{"raw CPU µs/msg", "dedupq CPU µs/msg"} {
		i := 0
		for i < len(header) && header[i] != col {
			i++
		}
		if i == len(header) {
			t.Fatalf("no column %q in %q", col, header)
		}
		v, err := strconv.ParseFloat(row[i], 64)
		if err != nil || v <= 0 {
			t.Errorf("%s = %q, want a positive number of µs", col, row[i])
		}
	}
}
