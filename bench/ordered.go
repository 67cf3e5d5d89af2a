package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/dedupq/dedupq"
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

// orderedGroup is the ordered group's setup: its rows on mem. (The
// JetStream rows wait for the ordered durable: branch chaos-ordered-js.)
func orderedGroup(context.Context, config) ([]row, func(), error) {
	return memOrderedRows(), func() {}, nil
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
