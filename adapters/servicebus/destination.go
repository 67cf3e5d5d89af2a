package servicebus

import "github.com/dedupq/dedupq/driver"

var (
	_ driver.DestinationNamer = (*Topic)(nil)
	_ driver.DestinationNamer = (*Subscription)(nil)
)

// Destination names the queue or topic sent to.
func (t *Topic) Destination() driver.Destination { return t.entity.destination() }

// Destination names the queue, or the topic and its subscription.
func (s *Subscription) Destination() driver.Destination { return s.entity.destination() }

func (e Entity) destination() driver.Destination {
	return driver.Destination{Name: e.sendPath(), Subscription: e.Subscription}
}
