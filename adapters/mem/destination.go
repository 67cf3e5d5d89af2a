package mem

import "github.com/dedupq/dedupq/driver"

var (
	_ driver.DestinationNamer = (*topic)(nil)
	_ driver.DestinationNamer = (*subscription)(nil)
)

// Destination names the queue.
func (t *topic) Destination() driver.Destination { return driver.Destination{Name: t.q.name} }

// Destination names the queue.
func (s *subscription) Destination() driver.Destination { return driver.Destination{Name: s.q.name} }
