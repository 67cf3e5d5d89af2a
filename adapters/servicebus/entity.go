package servicebus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/dedupq/dedupq/window"
)

// Backend is the name the adapter gives in windows and errors.
const Backend = "servicebus"

const (
	// MaxIDLength is Service Bus's limit on MessageId and SessionId.
	MaxIDLength = 128
	// DefaultMaxMessageBytes is the Standard tier's message size limit,
	// used when the entity reports none (Premium entities report theirs).
	DefaultMaxMessageBytes = 256 << 10
)

// Entity names what a Topic sends to or a Subscription receives from: a
// queue, or a topic (and, for receiving, one of its subscriptions).
type Entity struct {
	// Queue is the queue name; set either Queue or Topic.
	Queue string
	// Topic is the topic name.
	Topic string
	// Subscription is the topic subscription a Subscription receives from.
	Subscription string
}

// sendPath is the name the SDK's NewSender takes.
func (e Entity) sendPath() string {
	if e.Queue != "" {
		return e.Queue
	}
	return e.Topic
}

// String implements fmt.Stringer.
func (e Entity) String() string {
	switch {
	case e.Queue != "":
		return "queue " + e.Queue
	case e.Subscription != "":
		return "topic " + e.Topic + " subscription " + e.Subscription
	}
	return "topic " + e.Topic
}

func (e Entity) check(receiving bool) error {
	switch {
	case e.Queue != "" && e.Topic != "":
		return fmt.Errorf("dedupq/servicebus: entity names both queue %q and topic %q; name one", e.Queue, e.Topic)
	case e.Queue == "" && e.Topic == "":
		return errors.New("dedupq/servicebus: entity names no queue or topic")
	case e.Queue != "" && e.Subscription != "":
		return fmt.Errorf("dedupq/servicebus: a queue (%q) has no subscriptions (%q)", e.Queue, e.Subscription)
	case receiving && e.Topic != "" && e.Subscription == "":
		return fmt.Errorf("dedupq/servicebus: receiving from topic %q needs a subscription", e.Topic)
	}
	return nil
}

// EntityProperties are the entity properties that decide the window, the
// lease and the redelivery policy. For a topic subscription, the
// duplicate-detection and size fields are the topic's and the lock and
// delivery fields the subscription's, because that is where Service Bus
// keeps them.
type EntityProperties struct {
	// RequiresDuplicateDetection is fixed at creation; false means the
	// entity does not deduplicate at all.
	RequiresDuplicateDetection bool
	// DuplicateDetectionWindow is DuplicateDetectionHistoryTimeWindow
	// (20 s – 7 days), which can change after creation.
	DuplicateDetectionWindow time.Duration
	// LockDuration is the peek-lock lease (at most 5 minutes).
	LockDuration time.Duration
	// MaxDeliveryCount is the delivery count at which Service Bus
	// dead-letters a message.
	MaxDeliveryCount int
	// MaxMessageBytes is the largest message; 0 means
	// DefaultMaxMessageBytes.
	MaxMessageBytes int
	// EnablePartitioning and RequiresSession shape what a message must
	// carry (PartitionKey equal to SessionId, a SessionId).
	EnablePartitioning bool
	RequiresSession    bool
}

// propertiesSource reads entity properties. adminClient reads them through
// the management API; the seam exists because that API is HTTP/ATOM, which
// no AMQP double answers, so the tests supply their own.
type propertiesSource interface {
	Properties(ctx context.Context, e Entity) (EntityProperties, error)
}

// adminClient reads properties through the Service Bus management API; it
// needs Manage rights on the namespace.
type adminClient struct{ c *admin.Client }

// ErrEntityNotFound is matched by the error for an entity the management
// API does not know.
var ErrEntityNotFound = errors.New("entity not found")

func (a adminClient) Properties(ctx context.Context, e Entity) (EntityProperties, error) {
	var p EntityProperties
	var err error
	if e.Queue != "" {
		r, gerr := a.c.GetQueue(ctx, e.Queue, nil)
		if gerr != nil {
			return p, fmt.Errorf("dedupq/servicebus: reading queue %s: %w", e.Queue, gerr)
		}
		if r == nil {
			return p, fmt.Errorf("dedupq/servicebus: queue %s: %w", e.Queue, ErrEntityNotFound)
		}
		q := r.QueueProperties
		p.RequiresDuplicateDetection = deref(q.RequiresDuplicateDetection)
		p.EnablePartitioning = deref(q.EnablePartitioning)
		p.RequiresSession = deref(q.RequiresSession)
		p.MaxDeliveryCount = int(deref(q.MaxDeliveryCount))
		p.MaxMessageBytes = int(deref(q.MaxMessageSizeInKilobytes)) << 10
		if p.DuplicateDetectionWindow, err = isoDuration(q.DuplicateDetectionHistoryTimeWindow); err != nil {
			return p, fmt.Errorf("dedupq/servicebus: queue %s: DuplicateDetectionHistoryTimeWindow: %w", e.Queue, err)
		}
		if p.LockDuration, err = isoDuration(q.LockDuration); err != nil {
			return p, fmt.Errorf("dedupq/servicebus: queue %s: LockDuration: %w", e.Queue, err)
		}
		return p, nil
	}
	r, gerr := a.c.GetTopic(ctx, e.Topic, nil)
	if gerr != nil {
		return p, fmt.Errorf("dedupq/servicebus: reading topic %s: %w", e.Topic, gerr)
	}
	if r == nil {
		return p, fmt.Errorf("dedupq/servicebus: topic %s: %w", e.Topic, ErrEntityNotFound)
	}
	tp := r.TopicProperties
	p.RequiresDuplicateDetection = deref(tp.RequiresDuplicateDetection)
	p.EnablePartitioning = deref(tp.EnablePartitioning)
	p.MaxMessageBytes = int(deref(tp.MaxMessageSizeInKilobytes)) << 10
	if p.DuplicateDetectionWindow, err = isoDuration(tp.DuplicateDetectionHistoryTimeWindow); err != nil {
		return p, fmt.Errorf("dedupq/servicebus: topic %s: DuplicateDetectionHistoryTimeWindow: %w", e.Topic, err)
	}
	if e.Subscription == "" {
		return p, nil
	}
	s, gerr := a.c.GetSubscription(ctx, e.Topic, e.Subscription, nil)
	if gerr != nil {
		return p, fmt.Errorf("dedupq/servicebus: reading %s: %w", e, gerr)
	}
	if s == nil {
		return p, &missingError{err: fmt.Errorf("dedupq/servicebus: %s: %w", e, ErrEntityNotFound), topic: p}
	}
	sp := s.SubscriptionProperties
	p.RequiresSession = deref(sp.RequiresSession)
	p.MaxDeliveryCount = int(deref(sp.MaxDeliveryCount))
	if p.LockDuration, err = isoDuration(sp.LockDuration); err != nil {
		return p, fmt.Errorf("dedupq/servicebus: %s: LockDuration: %w", e, err)
	}
	return p, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// isoDuration parses the ISO 8601 durations the management API uses
// ("PT10M", "P7D", "PT0.5S", "P10675199DT2H48M5.4775807S"); nil is zero.
func isoDuration(s *string) (time.Duration, error) {
	if s == nil || *s == "" {
		return 0, nil
	}
	return parseISODuration(*s)
}

// parseISODuration parses an ISO 8601 duration of days, hours, minutes and
// seconds (no years, months or weeks, which the management API never
// uses for these properties), saturating at window.Forever.
func parseISODuration(s string) (time.Duration, error) {
	bad := func() (time.Duration, error) { return 0, fmt.Errorf("%q is not an ISO 8601 duration", s) }
	rest, ok := strings.CutPrefix(s, "P")
	if !ok || rest == "" {
		return bad()
	}
	var total float64
	inTime := false
	seen := ""
	for rest != "" {
		if rest[0] == 'T' {
			if inTime || len(rest) == 1 {
				return bad()
			}
			inTime, rest = true, rest[1:]
			continue
		}
		i := strings.IndexAny(rest, "DHMS")
		if i <= 0 {
			return bad()
		}
		num, unit := rest[:i], rest[i]
		rest = rest[i+1:]
		if strings.ContainsAny(num, "+-eE") {
			return bad()
		}
		v, err := strconv.ParseFloat(num, 64)
		if err != nil || v < 0 {
			return bad()
		}
		if strings.ContainsRune(seen, rune(unit)) || (unit == 'D') == inTime {
			return bad()
		}
		seen += string(unit)
		switch unit {
		case 'D':
			total += v * float64(24*time.Hour)
		case 'H':
			total += v * float64(time.Hour)
		case 'M':
			total += v * float64(time.Minute)
		case 'S':
			total += v * float64(time.Second)
		}
	}
	if total >= float64(window.Forever) {
		return window.Forever, nil
	}
	return time.Duration(total), nil
}

// windowOf is the dedup window the properties give.
func windowOf(e Entity, p EntityProperties, stated, planned bool) window.Window {
	src := window.SourceDiscovered
	scope := e.String()
	if e.Topic != "" {
		scope = "topic " + e.Topic
	}
	if p.EnablePartitioning && p.RequiresDuplicateDetection {
		// Service Bus compares MessageId with the partition key there: the
		// same ID under another GroupKey is a new message.
		scope += ", per partition key (GroupKey)"
	}
	if p.RequiresSession {
		// What dedupq check prints of an entity: that it orders, and that
		// the lease of a delivery is its session's lock.
		scope += fmt.Sprintf(", ordered by session (GroupKey = SessionId), the lease a session lock of %s", window.FormatDuration(p.LockDuration))
	}
	if stated {
		// Stated by the program (Options.Stated), not read from the
		// entity: the label says so wherever the window is printed.
		src = window.SourceConfigured
		scope += ", not read from the entity"
	}
	if planned {
		// Options.Create's, reported before Provision creates it.
		scope += ", to be created"
	}
	w := window.Window{Backend: Backend, Source: src, Scope: scope}
	if p.RequiresDuplicateDetection && p.DuplicateDetectionWindow > 0 {
		w.Duration, w.Kind = p.DuplicateDetectionWindow, window.KindConfigured
	}
	w.Settings = settingsOf(e, w.Kind, stated, p.RequiresSession)
	return w
}

// settingsOf names the entity properties behind the window and the
// redelivery policy: the window is the queue's or topic's, the lock and
// delivery count the queue's or subscription's. Properties the program
// states (Options.Stated, the URL) must change there too. The backoff
// follows from LockDuration (see Subscription.Redelivery), so it is not
// named on its own.
func settingsOf(e Entity, k window.Kind, stated, sessions bool) window.Settings {
	receiver := "queue"
	if e.Queue == "" {
		receiver = "subscription"
	}
	name := func(property, param string) string {
		if stated {
			property += fmt.Sprintf(" and URL parameter %s (Options.Stated)", param)
		}
		return property
	}
	win := fmt.Sprintf("the %s's DuplicateDetectionHistoryTimeWindow", e.sendKind())
	if k == window.KindNone {
		win = fmt.Sprintf("the DuplicateDetectionHistoryTimeWindow of a %s recreated with RequiresDuplicateDetection (fixed at creation)", e.sendKind())
	}
	lock := fmt.Sprintf("the %s's LockDuration", receiver)
	if sessions {
		lock += " (the session lock)"
	}
	return window.Settings{
		Window:        name(win, "window"),
		AckWait:       name(lock, "ack_wait"),
		MaxDeliveries: name(fmt.Sprintf("the %s's MaxDeliveryCount", receiver), "max_deliveries"),
	}
}

// sendKind is "queue" or "topic": the kind of entity messages are sent to.
func (e Entity) sendKind() string {
	if e.Queue != "" {
		return "queue"
	}
	return "topic"
}
