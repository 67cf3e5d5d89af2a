// Runs the ordered group in quick mode on the in-memory broker (no
// server), so that CI keeps its rows working: each ordered side fails if
// a group's messages ran out of order.
package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestQuickOrdered(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-quick", "-only", "ordered"}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"| ordered | ordered 64 groups | 64 | mem Consumer unordered, Concurrency 64 |",
		"| ordered | ordered hot group | 64 | mem Consumer unordered, Concurrency 1 |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
