package window

import "time"

// Settings name, in a backend's own words, where its user changes each
// value the startup check reads: a URL parameter, a field of the adapter's
// options, a setting on the broker. A driver fills them in the Window it
// reports, once, so that the fixes of an UnsafeRetryError name what to
// change on that backend instead of a generic name. An empty field gets a
// generic name.
//
// Each name reads after a verb and before "to" or "from", as in "lower the
// durable's MaxDeliver (Config.MaxDeliver, URL parameter max_deliveries)
// to 3".
type Settings struct {
	// Window is where the dedup window's length is set. It is not used
	// for a KindFixed window, which no fix can raise; for a KindNone
	// window it is how to get one, and empty when there is no way.
	Window string
	// AckWait is where RedeliveryPolicy.AckWait, the lease on one
	// delivery, is set.
	AckWait string
	// MaxDeliveries is where RedeliveryPolicy.MaxDeliveries is bounded.
	MaxDeliveries string
	// Backoff is where RedeliveryPolicy.Backoff is set. Empty when the
	// backoff follows from another setting (a lock duration, say): then
	// no fix changes it on its own.
	Backoff string
	// Expiry is where RedeliveryPolicy.Expiry, the time after which the
	// broker delivers a message no more, is set. Empty when nothing sets
	// it: then no fix changes it.
	Expiry string
	// MinExpiry is the shortest expiry the setting named by Expiry takes
	// (Pub/Sub's retention: 10 minutes); no fix suggests less.
	MinExpiry time.Duration
}

// The generic names used when a driver names no setting.
const (
	genericAckWait       = "the broker's ack wait (the lease on one delivery)"
	genericMaxDeliveries = "the broker's max deliveries"
)

// windowSetting names where w's length is set, or "" when no fix can
// change it: a fixed window, or no window and no way named to get one.
func windowSetting(w Window) string {
	switch {
	case w.Kind == KindFixed:
		return ""
	case w.Settings.Window != "":
		return w.Settings.Window
	case w.Kind == KindConfigured:
		if w.Backend == "" {
			return "the broker's dedup window"
		}
		return "the " + w.Backend + " dedup window"
	}
	return ""
}

func (s Settings) ackWait() string {
	if s.AckWait != "" {
		return s.AckWait
	}
	return genericAckWait
}

func (s Settings) maxDeliveries() string {
	if s.MaxDeliveries != "" {
		return s.MaxDeliveries
	}
	return genericMaxDeliveries
}
