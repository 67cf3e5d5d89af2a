package servicebus

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/dedupq/dedupq/driver"
)

// entityCreator creates an entity that is missing. adminClient creates
// through the management API; the tests supply their own (see
// propertiesSource).
type entityCreator interface {
	// Create creates what of e is missing (the queue; the topic, and the
	// subscription when e names one) with p's properties, and nothing
	// else; it succeeds when e exists already, whoever created it.
	Create(ctx context.Context, e Entity, p EntityProperties) error
}

// missingError is the management API's answer for a topic subscription
// whose topic exists but whose subscription does not: the topic's
// properties are real, and only the subscription's are to be created.
type missingError struct {
	err   error
	topic EntityProperties // the topic's fields, as read
}

func (e *missingError) Error() string { return e.err.Error() }
func (e *missingError) Unwrap() error { return e.err }

// creator is what creates the entity for Options.Create.
func (o Options) creator() (entityCreator, error) {
	switch {
	case o.propsFrom != nil:
		if c, ok := o.propsFrom.(entityCreator); ok {
			return c, nil
		}
	case o.Admin != nil:
		return adminClient{o.Admin}, nil
	}
	return nil, errors.New("dedupq/servicebus: Options.Create needs Options.Admin (the management API, with Manage rights) to create the entity")
}

// read reads e's properties; with Options.Create, an entity that does not
// exist yet reads as what Provision will create (missing), and one that
// exists must agree with it on RequiresSession, which Service Bus fixes at
// creation.
func (o Options) read(ctx context.Context, e Entity) (p EntityProperties, missing bool, err error) {
	p, err = o.props(ctx, e)
	if o.Create == nil {
		return p, false, err
	}
	var me *missingError
	switch {
	case errors.As(err, &me):
		plan := *o.Create
		plan.RequiresDuplicateDetection, plan.DuplicateDetectionWindow = me.topic.RequiresDuplicateDetection, me.topic.DuplicateDetectionWindow
		plan.EnablePartitioning, plan.MaxMessageBytes = me.topic.EnablePartitioning, me.topic.MaxMessageBytes
		return plan, true, nil
	case errors.Is(err, ErrEntityNotFound):
		return *o.Create, true, nil
	case err != nil:
		return p, false, err
	}
	if (e.Queue != "" || e.Subscription != "") && p.RequiresSession != o.Create.RequiresSession {
		want := "without sessions"
		if o.Create.RequiresSession {
			want = "with sessions (sessions=true)"
		}
		return p, false, fmt.Errorf("dedupq/servicebus: %s exists with RequiresSession %v, but the configuration asks for it %s; RequiresSession is fixed at creation: use another entity, or delete this one for create=true to make it again", e, p.RequiresSession, want)
	}
	return p, false, nil
}

// provision creates e with Options.Create when it is missing (see
// driver.Provisioner) and reads it again.
func (o Options) provision(ctx context.Context, e Entity) (EntityProperties, error) {
	c, err := o.creator()
	if err != nil {
		return EntityProperties{}, err
	}
	if err := c.Create(ctx, e, *o.Create); err != nil {
		return EntityProperties{}, fmt.Errorf("dedupq/servicebus: creating %s: %w", e, err)
	}
	p, missing, err := o.read(ctx, e)
	if err == nil && missing {
		err = fmt.Errorf("dedupq/servicebus: %s: created, but the management API does not find it: %w", e, ErrEntityNotFound)
	}
	return p, err
}

var (
	_ driver.Provisioner = (*Topic)(nil)
	_ driver.Provisioner = (*Subscription)(nil)
)

// Provision creates the queue or topic when Options.Create asks for it
// and it is missing (driver.Provisioner); otherwise it does nothing.
func (t *Topic) Provision(ctx context.Context) error {
	return t.opts.provisionInto(ctx, t.entity, &t.mu, &t.props, &t.missing)
}

// Provision creates the queue, or the topic and the subscription, when
// Options.Create asks for it and they are missing (driver.Provisioner);
// otherwise it does nothing.
func (s *Subscription) Provision(ctx context.Context) error {
	return s.opts.provisionInto(ctx, s.entity, &s.mu, &s.props, &s.missing)
}

// provisionInto provisions e when *missing says it is, and records what
// it reads then in *props; mu guards both.
func (o Options) provisionInto(ctx context.Context, e Entity, mu *sync.Mutex, props *EntityProperties, missing *bool) error {
	mu.Lock()
	todo := *missing
	mu.Unlock()
	if !todo {
		return nil
	}
	p, err := o.provision(ctx, e)
	if err != nil {
		return err
	}
	mu.Lock()
	*props, *missing = p, false
	mu.Unlock()
	return nil
}

// Create creates what of e is missing through the management API.
func (a adminClient) Create(ctx context.Context, e Entity, p EntityProperties) error {
	if e.Queue != "" {
		r, err := a.c.GetQueue(ctx, e.Queue, nil)
		if err != nil || r != nil {
			return err
		}
		_, err = a.c.CreateQueue(ctx, e.Queue, &admin.CreateQueueOptions{Properties: &admin.QueueProperties{
			RequiresDuplicateDetection:          &p.RequiresDuplicateDetection,
			DuplicateDetectionHistoryTimeWindow: isoOrNil(p.DuplicateDetectionWindow),
			LockDuration:                        isoOrNil(p.LockDuration),
			MaxDeliveryCount:                    int32OrNil(p.MaxDeliveryCount),
			MaxMessageSizeInKilobytes:           kilobytesOrNil(p.MaxMessageBytes),
			EnablePartitioning:                  &p.EnablePartitioning,
			RequiresSession:                     &p.RequiresSession,
		}})
		return existsIsFine(err)
	}
	created := false
	r, err := a.c.GetTopic(ctx, e.Topic, nil)
	if err != nil {
		return err
	}
	if r == nil {
		_, err = a.c.CreateTopic(ctx, e.Topic, &admin.CreateTopicOptions{Properties: &admin.TopicProperties{
			RequiresDuplicateDetection:          &p.RequiresDuplicateDetection,
			DuplicateDetectionHistoryTimeWindow: isoOrNil(p.DuplicateDetectionWindow),
			MaxMessageSizeInKilobytes:           kilobytesOrNil(p.MaxMessageBytes),
			EnablePartitioning:                  &p.EnablePartitioning,
		}})
		if err = existsIsFine(err); err != nil {
			return err
		}
		created = true
	}
	if e.Subscription == "" {
		return nil
	}
	s, err := a.c.GetSubscription(ctx, e.Topic, e.Subscription, nil)
	if err == nil && s == nil {
		_, err = a.c.CreateSubscription(ctx, e.Topic, e.Subscription, &admin.CreateSubscriptionOptions{Properties: &admin.SubscriptionProperties{
			LockDuration:     isoOrNil(p.LockDuration),
			MaxDeliveryCount: int32OrNil(p.MaxDeliveryCount),
			RequiresSession:  &p.RequiresSession,
		}})
		err = existsIsFine(err)
	}
	if err != nil && created {
		// A topic this call created has no subscription yet, so nothing
		// else can depend on it: leave the namespace as it was.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if _, derr := a.c.DeleteTopic(dctx, e.Topic, nil); derr != nil {
			err = errors.Join(err, fmt.Errorf("removing the topic %s it created: %w", e.Topic, derr))
		}
	}
	return err
}

// existsIsFine turns the management API's 409 Conflict (created by
// another process meanwhile) into success.
func existsIsFine(err error) error {
	var re *azcore.ResponseError
	if errors.As(err, &re) && re.StatusCode == http.StatusConflict {
		return nil
	}
	return err
}

func isoOrNil(d time.Duration) *string {
	if d <= 0 {
		return nil
	}
	s := "PT" + strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "S"
	return &s
}

func int32OrNil(n int) *int32 {
	if n <= 0 {
		return nil
	}
	v := int32(n)
	return &v
}

// kilobytesOrNil is a size for MaxMessageSizeInKilobytes, which only
// Premium namespaces take; the Standard tier's size is left unset.
func kilobytesOrNil(n int) *int64 {
	if n <= DefaultMaxMessageBytes {
		return nil
	}
	v := int64(n >> 10)
	return &v
}
