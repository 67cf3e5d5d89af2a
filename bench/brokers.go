package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq"
	djs "github.com/dedupq/dedupq/adapters/jetstream"
	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/dedup/redisstore"
	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/window"
)

// payload is the 1 KiB body of every broker message.
var payload = make([]byte, 1024)

// consumeConcurrency is the dedupq consumer's handler concurrency and the
// raw loops' batch size: the same parallelism for both.
const consumeConcurrency = 64

// publishTimed builds n messages with IDs prefix0… (in groupsOf groups
// when groups > 0) and publishes them in one PublishBatch, timed. Building
// them is timed as on the raw sides, which build their SDK's messages as
// they send them.
func publishTimed(ctx context.Context, pub *dedupq.Publisher, prefix string, groups int, n int64) (time.Duration, error) {
	w := startWatch()
	msgs := make([]*dedupq.Message, n)
	for i := range msgs {
		msgs[i] = &dedupq.Message{ID: prefix + strconv.Itoa(i), Body: payload}
		if groups > 0 {
			msgs[i].GroupKey = groupKey(int64(i), groups)
		}
	}
	_, err := pub.PublishBatch(ctx, msgs)
	return w.stop(), err
}

// concurrently runs send for 0 … n−1 from consumeConcurrency goroutines,
// each taking the next index when its last send returned, and returns the
// first error.
func concurrently(n int64, send func(i int64) error) error {
	var next atomic.Int64
	var first atomic.Pointer[error]
	var wg sync.WaitGroup
	for range consumeConcurrency {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < n && first.Load() == nil; i = next.Add(1) - 1 {
				if err := send(i); err != nil {
					first.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		return *err
	}
	return nil
}

// groupKey spreads messages over groups message groups.
func groupKey(i int64, groups int) string { return groupNames[i%int64(groups)] }

// groupNames are made once, so that no side pays for formatting them.
var groupNames = func() []string {
	s := make([]string, consumeConcurrency)
	for i := range s {
		s[i] = "g" + strconv.Itoa(i)
	}
	return s
}()

// consumeAll runs a dedupq consumer on sub until n distinct messages were
// handled, with dedup when g is non-nil.
func consumeAll(ctx context.Context, sub driver.Subscription, g dedupq.Deduplicator, n int64) (time.Duration, error) {
	opts := dedupq.ConsumerOptions{Concurrency: consumeConcurrency, PublisherSpan: window.DefaultRetryPolicy().Span()}
	if g != nil {
		opts.Dedup = g
	}
	return consumeWith(ctx, sub, opts, n, nil)
}

// consumeWith runs a Consumer with opts on sub until n distinct messages
// were handled. first, when set, sees each message's first handling, in
// the order they ran (under a lock), and its first error fails the run.
func consumeWith(ctx context.Context, sub driver.Subscription, opts dedupq.ConsumerOptions, n int64, first func(*dedupq.Delivery) error) (time.Duration, error) {
	con, err := dedupq.NewConsumer(ctx, sub, opts)
	if err != nil {
		return 0, err
	}
	defer con.Close(context.Background())
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var mu sync.Mutex
	handled := make(map[string]bool, n)
	var failed error
	w := startWatch()
	err = con.Run(ctx, func(_ context.Context, d *dedupq.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		if handled[d.Message.ID] {
			return nil
		}
		handled[d.Message.ID] = true
		if first != nil && failed == nil {
			failed = first(d)
		}
		if int64(len(handled)) == n {
			cancel() // Run returns once every delivery is settled
		}
		return nil
	})
	elapsed := w.stop()
	mu.Lock()
	got := int64(len(handled))
	mu.Unlock()
	switch {
	case failed != nil:
		return 0, failed
	case got < n:
		return 0, fmt.Errorf("handled %d of %d messages (%v)", got, n, err)
	}
	return elapsed, err
}

func guardOn(s dedup.Store) (dedupq.Deduplicator, error) {
	return dedup.NewGuard(dedup.GuardOptions{Store: s, TTL: time.Hour})
}

// passThrough is a Deduplicator that runs the handler as it is and asks no
// store. A Consumer with it runs as with a Guard (acks sent unconfirmed,
// settles off the handler slots): a row with it shows what the Consumer
// itself costs of a consume+guard row, and the Guard row the rest.
type passThrough struct{}

func (passThrough) Wrap(h dedupq.Handler) dedupq.Handler { return h }
func (passThrough) TTL() time.Duration                   { return time.Hour }

func memRows(context.Context, config) ([]row, func(), error) {
	// Every side gets a broker of its own: one shared broker would keep
	// every side's messages (published ones are never consumed) and dedup
	// IDs for the whole run, and the growing heap would slow each later
	// row's garbage collection.
	newBroker := func() *mem.Broker { return mem.NewBroker(mem.Options{DedupWindow: time.Hour, MaxDeliveries: 5}) }
	queue := func(side string, round int) string { return fmt.Sprintf("%s-%d-%s", side, round, randomName("")) }
	rawPublish := side{"driver SendBatch", func(ctx context.Context, round int, n int64) (time.Duration, error) {
		top := newBroker().Topic(queue("raw-pub", round))
		return sendAll(ctx, top, "m", n)
	}}
	dqPublish := side{"Publisher", func(ctx context.Context, round int, n int64) (time.Duration, error) {
		pub, err := dedupq.NewPublisher(ctx, newBroker().Topic(queue("dq-pub", round)), dedupq.PublisherOptions{})
		if err != nil {
			return 0, err
		}
		defer pub.Close(context.Background())
		return publishTimed(ctx, pub, "m", 0, n)
	}}
	filled := func(ctx context.Context, name string, n int64) (driver.Subscription, error) {
		return untimed(ctx, func(ctx context.Context) (driver.Subscription, error) {
			broker := newBroker()
			_, err := sendAll(ctx, broker.Topic(name), "m", n)
			return broker.Subscription(name), err
		})
	}
	rawConsume := side{"driver Receive+Ack", func(ctx context.Context, round int, n int64) (time.Duration, error) {
		name := queue("raw-con", round)
		sub, err := filled(ctx, name, n)
		if err != nil {
			return 0, err
		}
		defer sub.Close()
		w := startWatch()
		for done := int64(0); done < n; {
			ds, err := sub.Receive(ctx, consumeConcurrency)
			if err != nil {
				return 0, err
			}
			for _, d := range ds {
				if err := sub.Ack(ctx, d); err != nil {
					return 0, err
				}
				done++
			}
		}
		return w.stop(), nil
	}}
	dqConsume := func(name string, guarded bool) side {
		return side{name, func(ctx context.Context, round int, n int64) (time.Duration, error) {
			sub, err := filled(ctx, queue("dq-con", round), n)
			if err != nil {
				return 0, err
			}
			return consumeGuarded(ctx, sub, guarded, n)
		}}
	}
	rows := []row{
		{name: "publish 1 KiB", conc: 1, n: 200_000, allocGoal: true, raw: rawPublish, dq: dqPublish},
		{name: "consume", conc: consumeConcurrency, n: 200_000, allocGoal: true, raw: rawConsume, dq: dqConsume("Consumer", false)},
		{name: "consume+guard", conc: consumeConcurrency, n: 200_000, goal: 0.8, raw: rawConsume, dq: dqConsume("Consumer+Guard(memstore)", true)},
	}
	return rows, func() {}, nil
}

// consumeGuarded is consumeAll behind a Guard on a fresh memstore when
// guarded, without one otherwise.
func consumeGuarded(ctx context.Context, sub driver.Subscription, guarded bool, n int64) (time.Duration, error) {
	var g dedupq.Deduplicator
	if guarded {
		var err error
		if g, err = guardOn(memstore.New(nil)); err != nil {
			return 0, err
		}
	}
	return consumeAll(ctx, sub, g, n)
}

// sendAll stores n messages through the driver in batches of its MaxBatch.
func sendAll(ctx context.Context, top driver.Topic, prefix string, n int64) (time.Duration, error) {
	batch := make([]*driver.Message, 0, top.MaxBatch())
	w := startWatch()
	for i := int64(0); i < n; {
		batch = batch[:0]
		for ; i < n && len(batch) < cap(batch); i++ {
			batch = append(batch, &driver.Message{ID: prefix + strconv.FormatInt(i, 10), Body: payload})
		}
		res, err := top.SendBatch(ctx, batch)
		if err != nil {
			return 0, err
		}
		for _, r := range res {
			if r.Err != nil {
				return 0, r.Err
			}
		}
	}
	return w.stop(), nil
}

func jetstreamEmbeddedRows(ctx context.Context, c config) ([]row, func(), error) {
	url, stop, err := embedded.Run(ctx, "")
	if err != nil {
		return nil, nil, err
	}
	rows, cleanup, err := jetstreamRows(ctx, c, url)
	if err != nil {
		stop()
		return nil, nil, err
	}
	return rows, func() { cleanup(); stop() }, nil
}

func jetstreamURLRows(ctx context.Context, c config) ([]row, func(), error) {
	return jetstreamRows(ctx, c, c.natsURL)
}

func jetstreamRows(ctx context.Context, c config, url string) ([]row, func(), error) {
	nc, err := nats.Connect(url, nats.ReconnectBufSize(-1))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	var streams []string
	// stream creates a fresh file-backed stream and its durable.
	stream := func(ctx context.Context) (djs.Config, error) {
		name := randomName("BENCH_")
		cfg := djs.Config{Stream: name, Subject: "bench." + name, Durable: "bench", MaxDeliver: 5}
		// Made here, not by OpenTopic's CreateStream: a topic removes the
		// stream it made when it closes.
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{cfg.Subject, cfg.Subject + ".>"}, Storage: jetstream.FileStorage})
		if err == nil {
			streams = append(streams, name)
		}
		return cfg, err
	}
	// Warm the server up, so that the first round's first side does not
	// pay for a cold start alone.
	warm, err := stream(ctx)
	if err == nil {
		err = publishAll(ctx, js, warm.Subject, "warm", 2000)
	}
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	rdb := redis.NewClient(&redis.Options{Addr: c.redis, PoolSize: 64})
	rawPublish := side{"PublishAsync", func(ctx context.Context, _ int, n int64) (time.Duration, error) {
		cfg, err := stream(ctx)
		if err != nil {
			return 0, err
		}
		w := startWatch()
		if err := publishAll(ctx, js, cfg.Subject, "m", n); err != nil {
			return 0, err
		}
		return w.stop(), nil
	}}
	// publisher is a Publisher on a fresh stream.
	publisher := func(ctx context.Context) (*dedupq.Publisher, error) {
		cfg, err := stream(ctx)
		if err != nil {
			return nil, err
		}
		top, err := djs.OpenTopic(ctx, nc, cfg)
		if err != nil {
			return nil, err
		}
		return dedupq.NewPublisher(ctx, top, dedupq.PublisherOptions{})
	}
	dqPublish := side{"Publisher", func(ctx context.Context, _ int, n int64) (time.Duration, error) {
		pub, err := publisher(ctx)
		if err != nil {
			return 0, err
		}
		defer pub.Close(context.Background())
		return publishTimed(ctx, pub, "m", 0, n)
	}}
	// One message a call from 64 goroutines, each waiting for its own
	// answer.
	rawCalls := side{"PublishMsg×64 goroutines", func(ctx context.Context, _ int, n int64) (time.Duration, error) {
		cfg, err := stream(ctx)
		if err != nil {
			return 0, err
		}
		w := startWatch()
		err = concurrently(n, func(i int64) error {
			_, err := js.PublishMsg(ctx, &nats.Msg{Subject: cfg.Subject, Data: payload}, jetstream.WithMsgID("m"+strconv.FormatInt(i, 10)))
			return err
		})
		return w.stop(), err
	}}
	dqCalls := side{"Publish×64 goroutines", func(ctx context.Context, _ int, n int64) (time.Duration, error) {
		pub, err := publisher(ctx)
		if err != nil {
			return 0, err
		}
		defer pub.Close(context.Background())
		w := startWatch()
		err = concurrently(n, func(i int64) error {
			_, err := pub.Publish(ctx, &dedupq.Message{ID: "m" + strconv.FormatInt(i, 10), Body: payload})
			return err
		})
		return w.stop(), err
	}}
	filled := func(ctx context.Context, n int64) (djs.Config, error) {
		return untimed(ctx, func(ctx context.Context) (djs.Config, error) {
			cfg, err := stream(ctx)
			if err == nil {
				err = publishAll(ctx, js, cfg.Subject, "m", n)
			}
			return cfg, err
		})
	}
	// rawConsumer is a durable pull consumer on a stream filled with n
	// messages, for a raw side.
	rawConsumer := func(ctx context.Context, n int64) (jetstream.Consumer, error) {
		cfg, err := filled(ctx, n)
		if err != nil {
			return nil, err
		}
		return js.CreateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{Durable: cfg.Durable, AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5})
	}
	rawConsume := side{"Fetch+Ack", func(ctx context.Context, _ int, n int64) (time.Duration, error) {
		cons, err := rawConsumer(ctx, n)
		if err != nil {
			return 0, err
		}
		deadline := time.Now().Add(5 * time.Minute)
		w := startWatch()
		// Counted per stream sequence: a redelivery does not count twice.
		seen := make(map[uint64]bool, n)
		for int64(len(seen)) < n {
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("consumed %d of %d in 5 minutes", len(seen), n)
			}
			// Never more than remain: a fetch waits its MaxWait for a
			// batch the stream cannot fill.
			batch, err := cons.Fetch(int(min(consumeConcurrency, n-int64(len(seen)))), jetstream.FetchMaxWait(time.Second))
			if err != nil {
				return 0, err
			}
			for m := range batch.Messages() {
				meta, err := m.Metadata()
				if err != nil {
					return 0, err
				}
				if err := m.Ack(); err != nil { // fire and forget: fails only locally
					return 0, err
				}
				seen[meta.Sequence.Stream] = true
			}
			if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
				return 0, err
			}
		}
		if err := nc.Flush(); err != nil {
			return 0, err
		}
		return w.stop(), nil
	}}
	// rawConsumeConfirmed acks as the Consumer without Dedup must (a lost
	// ack would repeat the handler's effect): DoubleAck, a request the
	// server answers, consumeConcurrency of them in flight at once on a
	// fixed pool of goroutines, under one context with a deadline so that
	// no ack makes a timer of its own. An extra baseline beside Fetch+Ack:
	// it shows how much of the consume row's gap the confirmation is.
	rawConsumeConfirmed := side{"Fetch+DoubleAck", func(ctx context.Context, _ int, n int64) (time.Duration, error) {
		cons, err := rawConsumer(ctx, n)
		if err != nil {
			return 0, err
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			ackErr error
		)
		work := make(chan jetstream.Msg)
		w := startWatch()
		wg.Add(consumeConcurrency)
		for range consumeConcurrency {
			go func() {
				defer wg.Done()
				for m := range work {
					if err := m.DoubleAck(ctx); err != nil {
						mu.Lock()
						ackErr = cmp.Or(ackErr, err)
						mu.Unlock()
					}
				}
			}()
		}
		err = func() error {
			defer func() { close(work); wg.Wait() }()
			seen := make(map[uint64]bool, n)
			for int64(len(seen)) < n {
				if err := ctx.Err(); err != nil {
					return fmt.Errorf("consumed %d of %d: %w", len(seen), n, err)
				}
				batch, err := cons.Fetch(int(min(consumeConcurrency, n-int64(len(seen)))), jetstream.FetchMaxWait(time.Second))
				if err != nil {
					return err
				}
				for m := range batch.Messages() {
					meta, err := m.Metadata()
					if err != nil {
						return err
					}
					work <- m
					seen[meta.Sequence.Stream] = true
				}
				if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
					return err
				}
			}
			return nil
		}()
		d := w.stop()
		if err == nil {
			err = ackErr // every ack has returned: wg.Wait
		}
		return d, err
	}}
	dqConsume := func(name string, newDedup func() (dedupq.Deduplicator, error)) side {
		return side{name, func(ctx context.Context, _ int, n int64) (time.Duration, error) {
			cfg, err := filled(ctx, n)
			if err != nil {
				return 0, err
			}
			sub, err := djs.OpenSubscription(ctx, nc, cfg)
			if err != nil {
				return 0, err
			}
			var g dedupq.Deduplicator
			if newDedup != nil {
				if g, err = newDedup(); err != nil {
					return 0, err
				}
			}
			return consumeAll(ctx, sub, g, n)
		}}
	}
	mems := func() (dedupq.Deduplicator, error) { return guardOn(memstore.New(nil)) }
	var namespaces []string // the Redis Guards', whose keys cleanup removes
	reds := func() (dedupq.Deduplicator, error) {
		ns := randomName("bench")
		namespaces = append(namespaces, ns)
		s, err := redisstore.New(rdb, redisstore.Options{Namespace: ns})
		if err != nil {
			return nil, err
		}
		return guardOn(s)
	}
	none := func() (dedupq.Deduplicator, error) { return passThrough{}, nil }
	n := int64(20_000)
	rows := []row{
		{name: "publish 1 KiB", conc: 1, n: n, goal: 0.95, allocGoal: true, raw: rawPublish, dq: dqPublish},
		{name: "publish calls", conc: consumeConcurrency, n: n, raw: rawCalls, dq: dqCalls},
		{name: "consume", conc: consumeConcurrency, n: n, allocGoal: true, raw: rawConsume, dq: dqConsume("Consumer", nil)},
		// The same Consumer beside raw acks confirmed as its own are.
		{name: "consume", conc: consumeConcurrency, n: n, raw: rawConsumeConfirmed, dq: dqConsume("Consumer", nil)},
		// The Consumer as it runs with a Guard (acks unconfirmed, settles
		// off the handler slots) but no store: the consume+guard gap split
		// into the Consumer's part and the Guard's.
		{name: "consume+guard", conc: consumeConcurrency, n: n, raw: rawConsume, dq: dqConsume("Consumer+pass-through Deduplicator", none)},
		{name: "consume+guard", conc: consumeConcurrency, n: n, goal: 0.8, raw: rawConsume, dq: dqConsume("Consumer+Guard(memstore)", mems)},
	}
	if c.only["redis"] || rdb.Ping(ctx).Err() == nil {
		rows = append(rows, row{name: "consume+guard", conc: consumeConcurrency, n: n, goal: 0.7, raw: rawConsume, dq: dqConsume("Consumer+Guard(redisstore)", reds)})
	}
	cleanup := func() {
		for _, s := range streams {
			_ = js.DeleteStream(context.Background(), s)
		}
		for _, ns := range namespaces {
			deleteNamespace(rdb, ns)
		}
		rdb.Close()
		nc.Close()
	}
	return rows, cleanup, nil
}

// publishAll publishes n messages asynchronously and waits for every ack.
// When the client's window of unacknowledged publishes stays full past its
// stall wait (a loaded machine), nats.go returns ErrTooManyStalledMsgs
// without sending: then it waits for the window to drain and sends again,
// the flow control that error asks for, so the baseline never fails for it.
func publishAll(ctx context.Context, js jetstream.JetStream, subject, prefix string, n int64) error {
	futures := make([]jetstream.PubAckFuture, 0, n)
	for i := range n {
		id := prefix + strconv.FormatInt(i, 10)
		for {
			f, err := js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: payload}, jetstream.WithMsgID(id))
			if err == nil {
				futures = append(futures, f)
				break
			}
			if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				return fmt.Errorf("publishing %s: %w", id, err)
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	for i, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("publishing message %d: %w", i, err)
		case <-timeout.C:
			return errors.New("publishes not acknowledged within a minute")
		}
	}
	return nil
}
