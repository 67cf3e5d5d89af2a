package sqs

import (
	"strings"

	"github.com/dedupq/dedupq/driver"
)

var (
	_ driver.DestinationNamer = (*Topic)(nil)
	_ driver.DestinationNamer = (*Subscription)(nil)
)

// Destination names the queue.
func (t *Topic) Destination() driver.Destination { return t.q.destination() }

// Destination names the queue.
func (s *Subscription) Destination() driver.Destination { return s.q.destination() }

// destination is the queue's name, also when it was opened by URL (whose
// last segment it is), so that both ends name it alike.
func (q *queue) destination() driver.Destination {
	return driver.Destination{Name: q.name[strings.LastIndexByte(q.name, '/')+1:]}
}
