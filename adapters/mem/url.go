package mem

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/driver"
)

func init() { dedupq.Register("mem", urlOpener{}) }

// urlBrokers holds the process-wide brokers behind mem:// URLs, one per
// queue name, so that a publisher and a consumer opened from URLs naming the
// same queue meet, whichever opens first.
var urlBrokers = struct {
	sync.Mutex
	m map[string]*Broker
}{m: make(map[string]*Broker)}

// URLBroker returns the process-wide broker behind mem://name, or nil when
// no URL has opened that queue yet. Its queue is also called name, so tests
// and demos read URLBroker(name).Stats(name).
//
// A mem URL is mem://NAME?param=value&… with these optional parameters:
//
//	window=2m          Options.DedupWindow (a Go duration; 0 or absent: no dedup)
//	ackwait=30s        Options.AckWait
//	maxdeliveries=5    Options.MaxDeliveries (0: unlimited)
//	backoff=1s,5s      Options.Backoff
//	seed=42            Options.Faults.Seed
//	duppublish=0.1     Options.Faults.DuplicatePublish (and dupdelivery, lostack)
//
// The first URL that names a queue creates its broker, on the real clock,
// with that URL's parameters; later URLs share it. A later URL may leave
// parameters out, but one that states a different value fails with a
// *dedupq.ParamError instead of silently reaching a broker configured
// otherwise. Unknown or malformed parameters fail the same way.
func URLBroker(name string) *Broker {
	urlBrokers.Lock()
	defer urlBrokers.Unlock()
	return urlBrokers.m[name]
}

// urlParam is one URL parameter: how to read it into Options and how to
// show an Options' value for comparison with another URL's.
type urlParam struct {
	set func(o *Options, v string) error
	get func(o Options) string
}

func durationParam(field func(*Options) *time.Duration) urlParam {
	return urlParam{
		set: func(o *Options, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return fmt.Errorf("want a non-negative Go duration such as 30s or 2m")
			}
			*field(o) = d
			return nil
		},
		get: func(o Options) string { return field(&o).String() },
	}
}

func probParam(field func(*Options) *float64) urlParam {
	return urlParam{
		set: func(o *Options, v string) error {
			p, err := strconv.ParseFloat(v, 64)
			if err != nil || !(p >= 0 && p <= 1) {
				return fmt.Errorf("want a probability between 0 and 1")
			}
			*field(o) = p
			return nil
		},
		get: func(o Options) string { return strconv.FormatFloat(*field(&o), 'g', -1, 64) },
	}
}

var urlParams = map[string]urlParam{
	"window":  durationParam(func(o *Options) *time.Duration { return &o.DedupWindow }),
	"ackwait": durationParam(func(o *Options) *time.Duration { return &o.AckWait }),
	"maxdeliveries": {
		set: func(o *Options, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				return fmt.Errorf("want a non-negative integer")
			}
			o.MaxDeliveries = n
			return nil
		},
		get: func(o Options) string { return strconv.Itoa(o.MaxDeliveries) },
	},
	"backoff": {
		set: func(o *Options, v string) error {
			o.Backoff = nil
			for _, s := range strings.Split(v, ",") {
				d, err := time.ParseDuration(strings.TrimSpace(s))
				if err != nil || d < 0 {
					return fmt.Errorf("want a comma-separated list of Go durations such as 1s,5s")
				}
				o.Backoff = append(o.Backoff, d)
			}
			return nil
		},
		get: func(o Options) string { return fmt.Sprint(o.Backoff) },
	},
	"seed": {
		set: func(o *Options, v string) error {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return fmt.Errorf("want an unsigned integer")
			}
			o.Faults.Seed = n
			return nil
		},
		get: func(o Options) string { return strconv.FormatUint(o.Faults.Seed, 10) },
	},
	"duppublish":  probParam(func(o *Options) *float64 { return &o.Faults.DuplicatePublish }),
	"dupdelivery": probParam(func(o *Options) *float64 { return &o.Faults.DuplicateDelivery }),
	"lostack":     probParam(func(o *Options) *float64 { return &o.Faults.LostAck }),
}

var queueNameRE = regexp.MustCompile(`^[A-Za-z0-9._~-]{1,255}$`)

// brokerForURL parses u and returns the queue name and its shared broker.
func brokerForURL(u *url.URL) (string, *Broker, error) {
	// No reason quotes a value from the URL: see dedupq.ParamError.
	bad := func(param, format string, args ...any) error {
		return dedupq.NewParamError(u, param, fmt.Sprintf(format, args...))
	}
	name := u.Host
	if name == "" {
		return "", nil, bad("name", "missing queue name: use mem://NAME")
	}
	if !queueNameRE.MatchString(name) {
		// The name shows in windows and errors: only a name.
		return "", nil, bad("name", "not a queue name (up to 255 letters, digits, '.', '_', '~', '-')")
	}
	if u.Path != "" && u.Path != "/" {
		return "", nil, bad("name", "unexpected path: the queue is named by the host, mem://NAME")
	}
	q, err := dedupq.QueryParams(u, slices.Sorted(maps.Keys(urlParams)), "an in-memory broker has none")
	if err != nil {
		return "", nil, err
	}
	keys := slices.Sorted(maps.Keys(q))
	var opts Options
	for _, k := range keys {
		if err := urlParams[k].set(&opts, q[k][0]); err != nil {
			return "", nil, bad(k, "%v", err)
		}
	}
	urlBrokers.Lock()
	defer urlBrokers.Unlock()
	b := urlBrokers.m[name]
	if b == nil {
		b = NewBroker(opts)
		urlBrokers.m[name] = b
		return name, b, nil
	}
	want := NewBroker(opts).opts // the same defaults, for comparison
	for _, k := range keys {
		if got, asked := urlParams[k].get(b.opts), urlParams[k].get(want); got != asked {
			return "", nil, bad(k, "the queue is already open in this process with %s=%s, not %s", k, got, asked)
		}
	}
	return name, b, nil
}

// urlOpener opens mem:// URLs for dedupq.OpenPublisher and
// dedupq.OpenConsumer.
type urlOpener struct{}

func (urlOpener) OpenTopic(_ context.Context, u *url.URL) (driver.Topic, error) {
	name, b, err := brokerForURL(u)
	if err != nil {
		return nil, err
	}
	return b.Topic(name), nil
}

func (urlOpener) OpenSubscription(_ context.Context, u *url.URL) (driver.Subscription, error) {
	name, b, err := brokerForURL(u)
	if err != nil {
		return nil, err
	}
	return b.Subscription(name), nil
}
