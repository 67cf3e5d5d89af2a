package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq"
	djs "github.com/dedupq/dedupq/adapters/jetstream"
	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/driver"
)

// The ordered group measures what ConsumerOptions.Ordered costs against
// the same Consumer unordered, on the same broker (issue 24): its rows'
// "raw" side is the unordered Consumer, not a raw SDK, since what a user
// weighs is the order, not the library.
//
//   - "64 groups": 64 GroupKeys at Concurrency 64, against the unordered
//     Consumer at Concurrency 64 on messages without a GroupKey (goal
//     0.8×).
//   - "hot group": every message in one GroupKey at Concurrency 64,
//     against the unordered Consumer at Concurrency 1 (goal 0.9×): one
//     group can go no faster than one handler at a time.
//
// The ordered sides check that each group's messages ran in publish
// order.

// orderedGroups is the number of groups of the "64 groups" rows.
const orderedGroups = consumeConcurrency

// orderedSide is a Consumer at concurrency conc, Ordered when groups > 0,
// over a subscription filled with n messages m0… (message i in group
// i % groups when groups > 0).
func orderedSide(name string, conc, groups int, fill func(ctx context.Context, groups int, n int64) (driver.Subscription, error)) side {
	return side{name, func(ctx context.Context, _ int, n int64) (time.Duration, error) {
		sub, err := untimed(ctx, func(ctx context.Context) (driver.Subscription, error) { return fill(ctx, groups, n) })
		if err != nil {
			return 0, err
		}
		return consumeOrdered(ctx, sub, conc, groups, n)
	}}
}

// consumeOrdered runs a Consumer at concurrency conc on sub until n
// distinct messages were handled and, when groups > 0, with Ordered,
// failing if a message of a group ran before an earlier one of it. The
// handler does the same work on either side.
func consumeOrdered(ctx context.Context, sub driver.Subscription, conc, groups int, n int64) (time.Duration, error) {
	last := make([]int64, max(groups, 1))
	for g := range last {
		last[g] = -1
	}
	return consumeWith(ctx, sub, dedupq.ConsumerOptions{Concurrency: conc, Ordered: groups > 0}, n, func(d *dedupq.Delivery) error {
		i, err := strconv.ParseInt(d.Message.ID[1:], 10, 64)
		if err != nil {
			return err
		}
		g := i % int64(len(last))
		if i < last[g] && groups > 0 {
			return fmt.Errorf("message m%d of group %d ran after m%d", i, g, last[g])
		}
		last[g] = i
		return nil
	})
}

// orderedRows are the ordered group's rows for a broker whose fill makes
// a subscription of its own holding n messages.
func orderedRows(broker string, n int64, fill func(ctx context.Context, groups int, n int64) (driver.Subscription, error)) []row {
	unordered := func(conc int) side {
		return orderedSide(fmt.Sprintf("%s Consumer unordered, Concurrency %d", broker, conc), conc, 0, fill)
	}
	return []row{
		{name: "ordered 64 groups", conc: consumeConcurrency, n: n, goal: 0.8,
			raw: unordered(consumeConcurrency),
			dq:  orderedSide(fmt.Sprintf("%s Consumer Ordered, %d groups", broker, orderedGroups), consumeConcurrency, orderedGroups, fill)},
		{name: "ordered hot group", conc: consumeConcurrency, n: n, goal: 0.9,
			raw: unordered(1),
			dq:  orderedSide(broker+" Consumer Ordered, 1 group", consumeConcurrency, 1, fill)},
	}
}

// orderedGroup is the ordered group's setup: its rows on mem and on an
// embedded JetStream server (a current nats-server, which ordered
// durables need).
func orderedGroup(ctx context.Context, c config) ([]row, func(), error) {
	js, cleanup, err := jetstreamOrderedRows(ctx)
	if err != nil {
		return nil, nil, err
	}
	return append(memOrderedRows(), js...), cleanup, nil
}

// memOrderedRows are the ordered rows on the in-memory broker, a broker
// of its own per side (see memRows).
func memOrderedRows() []row {
	fill := func(ctx context.Context, groups int, n int64) (driver.Subscription, error) {
		broker := mem.NewBroker(mem.Options{DedupWindow: time.Hour, MaxDeliveries: 5})
		if err := sendGrouped(ctx, broker.Topic("q"), groups, n); err != nil {
			return nil, err
		}
		return broker.Subscription("q"), nil
	}
	return orderedRows("mem", 200_000, fill)
}

// jetstreamOrderedRows are the ordered rows on an embedded server: each
// side on a fresh stream, the ordered ones through an ordered durable
// (ordered=true: a pinned priority group), the unordered ones through a
// plain durable.
func jetstreamOrderedRows(ctx context.Context) ([]row, func(), error) {
	url, stop, err := embedded.Run(ctx, "")
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(url, nats.ReconnectBufSize(-1))
	if err != nil {
		stop()
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		stop()
		return nil, nil, err
	}
	fill := func(ctx context.Context, groups int, n int64) (driver.Subscription, error) {
		// The last side's stream goes first: no side's server carries
		// the files of all the sides before it.
		for name := range js.StreamNames(ctx).Name() {
			if err := js.DeleteStream(ctx, name); err != nil {
				return nil, err
			}
		}
		name := randomName("ORDERED_")
		cfg := djs.Config{Stream: name, Subject: "bench." + name, Durable: "bench", MaxDeliver: 5, Ordered: groups > 0}
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{cfg.Subject, cfg.Subject + ".>"}, Storage: jetstream.FileStorage}); err != nil {
			return nil, err
		}
		top, err := djs.OpenTopic(ctx, nc, cfg)
		if err != nil {
			return nil, err
		}
		err = sendGrouped(ctx, top, groups, n)
		top.Close()
		if err != nil {
			return nil, err
		}
		return djs.OpenSubscription(ctx, nc, cfg)
	}
	return orderedRows("jetstream", 20_000, fill), func() { nc.Close(); stop() }, nil
}

// sendGrouped stores n messages m0… through top, in batches of its
// MaxBatch, message i in group i % groups when groups > 0.
func sendGrouped(ctx context.Context, top driver.Topic, groups int, n int64) error {
	batch := make([]*driver.Message, 0, top.MaxBatch())
	for i := int64(0); i < n; {
		batch = batch[:0]
		for ; i < n && len(batch) < cap(batch); i++ {
			m := &driver.Message{ID: "m" + strconv.FormatInt(i, 10), Body: payload}
			if groups > 0 {
				m.GroupKey = groupKey(i, groups)
			}
			batch = append(batch, m)
		}
		res, err := top.SendBatch(ctx, batch)
		if err != nil {
			return err
		}
		for _, r := range res {
			if r.Err != nil {
				return r.Err
			}
		}
	}
	return nil
}
