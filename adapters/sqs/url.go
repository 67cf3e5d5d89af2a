package sqs

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/driver"
)

// Scheme is the URL scheme the package registers.
const Scheme = "sqs"

func init() { dedupq.Register(Scheme, &URLOpener{}) }

// URLOpener opens sqs:// URLs. The package registers one with the default
// mux. Two forms name the queue:
//
//	sqs://orders.fifo?region=eu-west-1                       queue name, looked up with GetQueueUrl
//	sqs://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo   queue URL (https, or http with an http endpoint)
//
// Parameters (all optional):
//
//	ack_wait        Options.VisibilityTimeout, a Go duration in whole seconds ("45s")
//	backoff         Options.NackBackoff, comma-separated durations ("1s,10s,1m")
//	region          AWS region; else the standard AWS chain's (AWS_REGION, profile), else the
//	                region in an sqs.REGION.amazonaws.com host
//	endpoint        base endpoint, for emulators: http://127.0.0.1:4566
//	group           Options.DefaultGroup
//	hash_long_ids   Options.HashLongIDs (true/false)
//	wait_time       Options.WaitTime ("20s")
//	terminate       "dlq" (default: move to the redrive policy's dead-letter queue) or
//	                "delete" (Options.TerminateDeletes)
//	delete_linger   Options.DeleteLinger ("5ms")
//	create          Options.Create (true/false), for emulators only: with endpoint= naming one
//	                (refused without it, or with an AWS endpoint), create the queue when it is
//	                missing, with a dead-letter queue QUEUE-dlq.fifo and a RedrivePolicy
//	max_deliveries  Options.MaxReceiveCount: the maxReceiveCount (1–1000) of a queue create=true
//	                makes (default 5); an existing queue's must equal it
//
// ack_wait, backoff, create and max_deliveries have the same names on every
// backend that takes them (see the README's parameter table). With
// create=true the created queue's VisibilityTimeout is ack_wait's (default
// 30s, SQS's own). One URL then runs the whole flow on an emulator, with no
// queue made by hand:
//
//	sqs://orders.fifo?region=us-east-1&endpoint=http://127.0.0.1:4566&create=true
//
// Credentials come from the standard AWS chain only (environment, shared
// files, SSO, instance roles); a URL never carries them. A missing or
// malformed parameter is reported as a *dedupq.ParamError.
type URLOpener struct {
	// LoadOptions are passed to config.LoadDefaultConfig after the
	// opener's own (region), so they can override anything.
	LoadOptions []func(*config.LoadOptions) error
}

// OpenTopic opens a Topic for the queue the URL names.
func (o *URLOpener) OpenTopic(ctx context.Context, u *url.URL) (driver.Topic, error) {
	api, conns, queue, opts, err := o.open(ctx, u)
	if err != nil {
		return nil, err
	}
	t, err := OpenTopic(ctx, api, queue, opts)
	if err != nil {
		conns.close()
		return nil, err
	}
	t.conns = conns
	return t, nil
}

// OpenSubscription opens a Subscription for the queue the URL names.
func (o *URLOpener) OpenSubscription(ctx context.Context, u *url.URL) (driver.Subscription, error) {
	api, conns, queue, opts, err := o.open(ctx, u)
	if err != nil {
		return nil, err
	}
	s, err := OpenSubscription(ctx, api, queue, opts)
	if err != nil {
		conns.close()
		return nil, err
	}
	s.conns = conns
	return s, nil
}

var (
	queueNameRE    = regexp.MustCompile(`^[A-Za-z0-9_-]{1,75}(\.fifo)?$`)
	awsHostRE      = regexp.MustCompile(`^sqs\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?$`)
	regionRE       = regexp.MustCompile(`^[a-z0-9-]+$`)
	hostRE         = regexp.MustCompile(`^[A-Za-z0-9.-]+(:[0-9]+)?$|^\[[0-9A-Fa-f:.]+\](:[0-9]+)?$`)
	credentialHint = "they come from the standard AWS chain (AWS_ACCESS_KEY_ID, profiles, roles)"
	knownParams    = []string{"ack_wait", "backoff", "region", "endpoint", "group", "hash_long_ids", "wait_time", "terminate", "delete_linger", "create", "max_deliveries"}
)

// ParseURL reads an sqs:// URL into the queue (a name or a queue URL), the
// region and endpoint it names (either may be empty) and the Options. It
// does not contact AWS.
func ParseURL(u *url.URL) (queue, region, endpoint string, opts *Options, err error) {
	// No reason quotes a value from the URL: see dedupq.ParamError.
	bad := func(param, format string, args ...any) error {
		return dedupq.NewParamError(u, param, fmt.Sprintf(format, args...))
	}
	if u.Scheme != Scheme {
		return "", "", "", nil, bad("scheme", "want %s://", Scheme)
	}
	if u.User != nil {
		return "", "", "", nil, bad("credentials", "an sqs URL never carries credentials: %s", credentialHint)
	}
	q, err := dedupq.QueryParams(u, knownParams, credentialHint)
	if err != nil {
		return "", "", "", nil, err
	}
	region, endpoint = q.Get("region"), q.Get("endpoint")
	if q.Has("region") && !regionRE.MatchString(region) {
		return "", "", "", nil, bad("region", "not a region name such as eu-west-1")
	}
	if q.Has("endpoint") {
		e, perr := url.Parse(endpoint)
		if perr != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
			return "", "", "", nil, bad("endpoint", "not an absolute http(s) URL such as http://127.0.0.1:4566")
		}
		// The SDK quotes the endpoint in its errors: it must hold nothing
		// but an address.
		if e.User != nil || e.RawQuery != "" || e.ForceQuery || e.Fragment != "" {
			return "", "", "", nil, bad("endpoint", "credentials never go in a URL: %s; the endpoint is scheme://host:port[/path] only", credentialHint)
		}
	}
	path := strings.Trim(u.Path, "/")
	switch {
	case u.Host == "":
		return "", "", "", nil, bad("queue", "missing: give a queue name (sqs://orders.fifo) or a queue URL (sqs://HOST/ACCOUNT/orders.fifo)")
	case path == "":
		if !queueNameRE.MatchString(u.Host) {
			return "", "", "", nil, bad("queue", "the host is not a queue name (up to 80 characters: letters, digits, '-', '_', optional .fifo)")
		}
		queue = u.Host
	default:
		if !hostRE.MatchString(u.Host) {
			return "", "", "", nil, bad("queue", "the host is not a host name or address")
		}
		parts := strings.Split(path, "/")
		if len(parts) != 2 || parts[0] == "" || !queueNameRE.MatchString(parts[1]) {
			return "", "", "", nil, bad("queue", "the path is not ACCOUNT/QUEUE-NAME")
		}
		scheme := "https"
		if strings.HasPrefix(endpoint, "http://") {
			scheme = "http"
		}
		queue = scheme + "://" + u.Host + "/" + path
		if m := awsHostRE.FindStringSubmatch(u.Hostname()); m != nil && region == "" {
			region = m[1]
		}
	}
	o := &Options{DefaultGroup: q.Get("group")}
	if q.Has("group") && !validID(o.DefaultGroup) {
		return "", "", "", nil, bad("group", "not a valid MessageGroupId (1–128 ASCII letters, digits and punctuation)")
	}
	if q.Has("hash_long_ids") {
		b, perr := strconv.ParseBool(q.Get("hash_long_ids"))
		if perr != nil {
			return "", "", "", nil, bad("hash_long_ids", "want true or false")
		}
		o.HashLongIDs = b
	}
	durations := []struct {
		name     string
		dst      *time.Duration
		min, max time.Duration
	}{
		{"ack_wait", &o.VisibilityTimeout, time.Second, maxVisibility},
		{"wait_time", &o.WaitTime, 0, maxWait},
		{"delete_linger", &o.DeleteLinger, 0, time.Second},
	}
	for _, d := range durations {
		if !q.Has(d.name) {
			continue
		}
		v, perr := time.ParseDuration(q.Get(d.name))
		if perr != nil || v < d.min || v > d.max {
			return "", "", "", nil, bad(d.name, "want a duration between %s and %s", d.min, d.max)
		}
		if d.name == "ack_wait" && v%time.Second != 0 {
			return "", "", "", nil, bad(d.name, "want a whole number of seconds")
		}
		if d.name == "wait_time" && v > 0 && v < minWait {
			return "", "", "", nil, bad(d.name, "want 0 (20s) or a duration between %s and %s: SQS's shortest long poll is %s", minWait, d.max, minWait)
		}
		*d.dst = v
	}
	if q.Has("delete_linger") && o.DeleteLinger == 0 {
		o.DeleteLinger = -1 // "0" in a URL means no lingering, as a negative Options value does
	}
	if q.Has("backoff") {
		for _, s := range strings.Split(q.Get("backoff"), ",") {
			v, perr := time.ParseDuration(strings.TrimSpace(s))
			if perr != nil || v < 0 || v > maxVisibility {
				return "", "", "", nil, bad("backoff", "want a comma-separated list of durations up to 12h")
			}
			o.NackBackoff = append(o.NackBackoff, v)
		}
	}
	switch t := q.Get("terminate"); t {
	case "", "dlq":
	case "delete":
		o.TerminateDeletes = true
	default:
		return "", "", "", nil, bad("terminate", "want dlq or delete")
	}
	if q.Has("max_deliveries") {
		n, perr := strconv.Atoi(q.Get("max_deliveries"))
		if perr != nil || n < 1 || n > maxMaxReceiveCount {
			return "", "", "", nil, bad("max_deliveries", "want a whole number from 1 to %d (the RedrivePolicy maxReceiveCount)", maxMaxReceiveCount)
		}
		o.MaxReceiveCount = n
	}
	if q.Has("create") {
		b, perr := strconv.ParseBool(q.Get("create"))
		if perr != nil {
			return "", "", "", nil, bad("create", "want true or false")
		}
		if b {
			if why := createRefusal(queue, endpoint); why != "" {
				return "", "", "", nil, bad("create", "%s", why)
			}
		}
		o.Create = b
	}
	return queue, region, endpoint, o, nil
}

// ownedConns is the HTTP transport of a client the URL opener made, so
// that closing the Topic or Subscription closes its idle keep-alive
// connections, which would otherwise stay open (with their goroutines)
// until the transport's idle timeout.
type ownedConns struct{ tr *http.Transport }

// close closes the idle connections; nil (a client the caller made) does
// nothing.
func (c *ownedConns) close() {
	if c != nil && c.tr != nil {
		c.tr.CloseIdleConnections()
	}
}

func (o *URLOpener) open(ctx context.Context, u *url.URL) (*awssqs.Client, *ownedConns, string, *Options, error) {
	queue, region, endpoint, opts, err := ParseURL(u)
	if err != nil {
		return nil, nil, "", nil, err
	}
	var load []func(*config.LoadOptions) error
	if region != "" {
		load = append(load, config.WithRegion(region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, append(load, o.LoadOptions...)...)
	if err != nil {
		return nil, nil, "", nil, fmt.Errorf("dedupq/sqs: loading the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, nil, "", nil, dedupq.NewParamError(u, "region", "missing: set ?region= or AWS_REGION (or a profile's region)")
	}
	// Closing the Topic or Subscription closes the connections of a client
	// the opener made; a client from LoadOptions is the caller's to close.
	// The SDK's default client makes its transport out of sight, so the
	// opener makes the same transport itself (a copy of the default's
	// settings, redirects not followed, as the SDK's client does).
	conns := new(ownedConns)
	if b, ok := cfg.HTTPClient.(*awshttp.BuildableClient); ok {
		conns.tr = b.GetTransport()
		cfg.HTTPClient = KeepRequestBody(&http.Client{Transport: conns.tr, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}})
	}
	client := awssqs.NewFromConfig(cfg, func(so *awssqs.Options) {
		if endpoint != "" {
			so.BaseEndpoint = aws.String(endpoint)
		}
	})
	return client, conns, queue, opts, nil
}
