package jetstream

import "github.com/dedupq/dedupq/driver"

var (
	_ driver.DestinationNamer = (*Topic)(nil)
	_ driver.DestinationNamer = (*Subscription)(nil)
)

// Destination names the stream, which both ends share (the subject is
// one of the stream's, and carries the message's group).
func (t *Topic) Destination() driver.Destination { return driver.Destination{Name: t.cfg.Stream} }

// Destination names the stream and the durable consumer.
func (s *Subscription) Destination() driver.Destination {
	return driver.Destination{Name: s.cfg.Stream, Subscription: s.cfg.Durable}
}
