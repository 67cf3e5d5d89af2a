package mem

// The queue's indexes. Each keeps only the messages in one state, so that
// no operation walks the backlog: see queue for which index holds what.

// fifo is a first-in first-out list of messages: a slice consumed from a
// head index, whose consumed prefix is reclaimed when it is at least half
// the slice (amortised O(1): each move is paid for by an earlier pop), and
// which restarts at the front of its array when it empties, so a queue
// that drains and refills allocates nothing.
type fifo struct {
	ms   []*message
	head int
}

func (f *fifo) len() int { return len(f.ms) - f.head }

func (f *fifo) push(m *message) { f.ms = append(f.ms, m) }

// peek returns the oldest message, nil when there is none.
func (f *fifo) peek() *message {
	if f.head == len(f.ms) {
		return nil
	}
	return f.ms[f.head]
}

func (f *fifo) pop() *message {
	m := f.ms[f.head]
	f.ms[f.head] = nil // the slot must not keep a settled message alive
	f.head++
	switch {
	case f.head == len(f.ms):
		f.ms, f.head = f.ms[:0], 0
	case f.head >= 1024 && f.head >= len(f.ms)/2:
		n := copy(f.ms, f.ms[f.head:])
		clear(f.ms[n:])
		f.ms, f.head = f.ms[:n], 0
	}
	return m
}

// heap is a binary min-heap of messages ordered by before. It records each
// member's position in message.pos, so that a message leaves it or moves in
// it in O(log n) without a search. A message is in at most one heap at a
// time (ready-again or timed, never both), so one pos field serves both.
type heap struct {
	ms     []*message
	before func(a, b *message) bool
}

func (h *heap) len() int { return len(h.ms) }

// min returns the least message, nil when the heap is empty.
func (h *heap) min() *message {
	if len(h.ms) == 0 {
		return nil
	}
	return h.ms[0]
}

func (h *heap) push(m *message) {
	h.ms = append(h.ms, m)
	m.pos = len(h.ms) // 1-based: the zero pos means in no heap
	h.up(len(h.ms) - 1)
}

// remove takes m, which must be in h, out of it.
func (h *heap) remove(m *message) {
	i, last := m.pos-1, len(h.ms)-1
	if i != last {
		h.swap(i, last)
	}
	h.ms[last] = nil
	h.ms = h.ms[:last]
	m.pos = 0
	if i != last {
		h.fix(h.ms[i])
	}
}

// fix restores the order after m's key changed.
func (h *heap) fix(m *message) {
	i := m.pos - 1
	if !h.up(i) {
		h.down(i)
	}
}

func (h *heap) swap(i, j int) {
	h.ms[i], h.ms[j] = h.ms[j], h.ms[i]
	h.ms[i].pos, h.ms[j].pos = i+1, j+1
}

// up moves the element at i towards the root; it reports whether it moved.
func (h *heap) up(i int) bool {
	start := i
	for i > 0 {
		p := (i - 1) / 2
		if !h.before(h.ms[i], h.ms[p]) {
			break
		}
		h.swap(i, p)
		i = p
	}
	return i != start
}

func (h *heap) down(i int) {
	for {
		c := 2*i + 1
		if c >= len(h.ms) {
			return
		}
		if r := c + 1; r < len(h.ms) && h.before(h.ms[r], h.ms[c]) {
			c = r
		}
		if !h.before(h.ms[c], h.ms[i]) {
			return
		}
		h.swap(i, c)
		i = c
	}
}
