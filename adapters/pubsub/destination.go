package pubsub

import (
	"strings"

	"github.com/dedupq/dedupq/driver"
)

var (
	_ driver.DestinationNamer = (*Topic)(nil)
	_ driver.DestinationNamer = (*Subscription)(nil)
)

// Destination names the topic by its ID.
func (t *Topic) Destination() driver.Destination {
	return driver.Destination{Name: lastSegment(t.name)}
}

// Destination names the topic the subscription receives from, and the
// subscription, by their IDs.
func (s *Subscription) Destination() driver.Destination {
	return driver.Destination{Name: lastSegment(s.Info().Topic), Subscription: lastSegment(s.name)}
}

// lastSegment is the ID of a resource named by its ID or its full name
// (projects/P/topics/ID).
func lastSegment(name string) string { return name[strings.LastIndexByte(name, '/')+1:] }
