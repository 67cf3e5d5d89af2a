package servicebus

import (
	"fmt"

	"github.com/dedupq/dedupq/driver"
)

// Service Bus's property quotas
// (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas,
// "Message property size for a queue, topic, or subscription entity"). The
// broker refuses a message over either with a serialization error, and
// with it the whole transfer, so the valid messages batched with it too.
const (
	// MaxPropertyBytes bounds one application property (an attribute).
	MaxPropertyBytes = 32 << 10
	// MaxHeaderBytes bounds the header: every application property and
	// the system properties (MessageId, SessionId, PartitionKey, and those
	// the broker stamps: sequence number, enqueued time, lock token…).
	MaxHeaderBytes = 64 << 10
)

const (
	// propertyOverhead is what AMQP adds to a property beyond its name and
	// value: a str32 constructor and length for each.
	propertyOverhead = 2 * 5
	// brokerReserve keeps room in the header for the system properties
	// the broker stamps on receipt, which the sender never sees; their
	// size is not documented, so this errs on the generous side.
	brokerReserve = 1 << 10
	// partitionKeyAnnotation is the annotation the SDK puts PartitionKey
	// under.
	partitionKeyAnnotation = "x-opt-partition-key"
)

// PropertyQuotaError is a message over one of Service Bus's property
// quotas: an attribute over MaxPropertyBytes (Property names it), or a
// header over MaxHeaderBytes in all (Property is empty).
type PropertyQuotaError struct {
	// Property is the attribute's name; empty for the whole header.
	Property string
	// Bytes is the size counted, as CheckProperties counts it.
	Bytes int
	// Limit is MaxPropertyBytes or MaxHeaderBytes.
	Limit int
}

// Error implements the error interface. It names the attribute, never its
// value, which may hold anything.
func (e *PropertyQuotaError) Error() string {
	if e.Property != "" {
		return fmt.Sprintf("attribute %q is %d bytes with its name, Service Bus accepts at most %d per property", e.Property, e.Bytes, e.Limit)
	}
	return fmt.Sprintf("the message header is %d bytes (attributes, MessageId, SessionId, PartitionKey and what the broker adds), Service Bus accepts at most %d in all", e.Bytes, e.Limit)
}

// CheckProperties is the driver.Limits.Check of a Topic: it refuses a
// message over Service Bus's property quotas before anything of its batch
// is sent. It counts conservatively, as the broker's own serialization
// does not document its overheads: a property is its name and value in
// bytes plus their AMQP encoding, and the header adds the MessageId, the
// GroupKey twice (SessionId and PartitionKey) and a reserve for what the
// broker stamps.
func CheckProperties(m *driver.Message) (field string, err error) {
	header := brokerReserve + len(m.ID) + 5
	if m.GroupKey != "" {
		header += 2*(len(m.GroupKey)+5) + len(partitionKeyAnnotation) + 5
	}
	for k, v := range m.Attributes {
		n := len(k) + len(v) + propertyOverhead
		if n > MaxPropertyBytes {
			return "Attributes", &PropertyQuotaError{Property: k, Bytes: n, Limit: MaxPropertyBytes}
		}
		header += n
	}
	if header > MaxHeaderBytes {
		return "Attributes", &PropertyQuotaError{Bytes: header, Limit: MaxHeaderBytes}
	}
	return "", nil
}
