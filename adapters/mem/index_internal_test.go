// Talks to: nothing; the queue's index types alone.
package mem

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestHeapKeepsOrder pushes, removes and re-keys messages at random and
// checks the heap's minimum and each member's recorded position against a
// plain list.
func TestHeapKeepsOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	h := heap{before: func(a, b *message) bool { return a.seq < b.seq }}
	var in []*message
	for step := range 20_000 {
		switch op := r.IntN(4); {
		case op == 0 || len(in) == 0:
			m := &message{seq: r.Uint64N(1000)}
			h.push(m)
			in = append(in, m)
		case op == 1:
			i := r.IntN(len(in))
			h.remove(in[i])
			if in[i].pos != 0 {
				t.Fatalf("step %d: removed message keeps pos %d", step, in[i].pos)
			}
			in = slices.Delete(in, i, i+1)
		case op == 2:
			m := in[r.IntN(len(in))]
			m.seq = r.Uint64N(1000)
			h.fix(m)
		default:
			m := h.min()
			h.remove(m)
			i := slices.Index(in, m)
			in = slices.Delete(in, i, i+1)
		}
		if h.len() != len(in) {
			t.Fatalf("step %d: len %d, want %d", step, h.len(), len(in))
		}
		for i, m := range h.ms {
			if m.pos != i+1 {
				t.Fatalf("step %d: message at %d records pos %d", step, i, m.pos)
			}
		}
		if len(in) > 0 {
			least := slices.MinFunc(in, func(a, b *message) int { return int(a.seq) - int(b.seq) })
			if h.min().seq != least.seq {
				t.Fatalf("step %d: min seq %d, want %d", step, h.min().seq, least.seq)
			}
		}
	}
}

// TestFIFOReclaims checks the FIFO's order across its reclaim of the
// consumed prefix and its restart when empty, and that it keeps no popped
// message reachable.
func TestFIFOReclaims(t *testing.T) {
	var f fifo
	var want []*message
	var reclaims, restarts int
	r := rand.New(rand.NewPCG(3, 4))
	for step := range 60_000 {
		// Phases of growth and of draining, so that the FIFO reclaims its
		// prefix while it holds messages and also empties.
		push := r.IntN(3) > 0
		if step/10_000%2 == 1 {
			push = !push
		}
		if push || len(want) == 0 {
			m := &message{seq: uint64(step)}
			f.push(m)
			want = append(want, m)
		} else {
			head := f.head
			if got := f.pop(); got != want[0] {
				t.Fatalf("step %d: popped %d, want %d", step, got.seq, want[0].seq)
			}
			want = want[1:]
			switch {
			case f.len() == 0:
				restarts++
			case f.head < head:
				reclaims++
			}
		}
		if first := f.peek(); f.len() != len(want) || (len(want) == 0) != (first == nil) || (first != nil && first != want[0]) {
			t.Fatalf("step %d: len %d, want %d", step, f.len(), len(want))
		}
		if slices.ContainsFunc(f.ms[:f.head], func(m *message) bool { return m != nil }) {
			t.Fatalf("step %d: a popped slot still holds a message", step)
		}
	}
	if reclaims == 0 || restarts == 0 {
		t.Errorf("%d reclaims of the consumed prefix and %d restarts when empty, want some of each", reclaims, restarts)
	}
}
