package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// effect is one row of the effects table: one run of the handler whose
// work committed.
type effect struct {
	id       int
	instance string // the consumer process (or goroutine) that ran it
	// recorded is true when the dedup record of the key is known to have
	// committed with or after the effect: always under the TxGuard, where
	// both commit in one transaction; under a Guard, once the store's
	// Complete returned nil to the instance that ran it. An effect left
	// unrecorded (completion write failed, the process died between the
	// effect and the completion, the lease was lost while the handler
	// ran) is the documented gap that lets a later delivery repeat it.
	recorded bool
	at       time.Time
}

// outage is one server restart: down from start to end.
type outage struct {
	server     string
	start, end time.Time
	// forgets is true when the server keeps nothing across the restart
	// (Redis without persistence): the keys it held are gone.
	forgets bool
}

// result is what a run found. line is the summary line; problems are the
// breaches of what the store promises, and the run fails with any.
type result struct {
	backend, store                                 string
	published, effects, distinct, lost, duplicated int
	unrecorded, deadLettered                       int
	wall                                           time.Duration
	causes                                         map[string]int
	problems                                       []string
	// orderChecked: an ordered run, whose groups' first effects were
	// checked against publish order; outOfOrder counts those that were not.
	orderChecked bool
	outOfOrder   int
}

func (r *result) line() string {
	l := fmt.Sprintf("backend=%s store=%s published=%d effects=%d distinct=%d lost=%d duplicated=%d unrecorded=%d dead_lettered=%d",
		r.backend, r.store, r.published, r.effects, r.distinct, r.lost, r.duplicated, r.unrecorded, r.deadLettered)
	if r.orderChecked {
		l += fmt.Sprintf(" out_of_order=%d", r.outOfOrder)
	}
	return l + " wall=" + r.wall.Round(100*time.Millisecond).String()
}

func (r *result) problem(format string, args ...any) {
	r.problems = append(r.problems, fmt.Sprintf(format, args...))
}

// tally counts the effects of messages 0..n-1 and relates every duplicate
// to its cause. Each repeat of an effect must follow an earlier effect of
// the same ID that was left unrecorded (the gap counted as Unrecorded), or
// a restart of a server that forgets (between the two effects); any other
// repeat is a bug, reported in problems with the effects that show it.
func tally(r *result, n int, effects []effect, outages []outage) {
	r.published = n
	r.effects = len(effects)
	r.causes = map[string]int{}
	byID := make(map[int][]effect, n)
	for _, e := range effects {
		if e.id < 0 || e.id >= n {
			r.problem("effect of unknown message %d by %s", e.id, e.instance)
			continue
		}
		byID[e.id] = append(byID[e.id], e)
		if !e.recorded {
			r.unrecorded++
		}
	}
	r.distinct = len(byID)
	var missing []string
	for i := range n {
		if len(byID[i]) == 0 {
			r.lost++
			if len(missing) < 10 {
				missing = append(missing, messageID(i))
			}
		}
	}
	if r.lost > 0 {
		r.problem("%d published message(s) took no effect, e.g. %s", r.lost, strings.Join(missing, " "))
	}
	ids := make([]int, 0, len(byID))
	for id, es := range byID {
		if len(es) > 1 {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	r.duplicated = len(ids)
	unexplained := 0
	for _, id := range ids {
		es := byID[id]
		slices.SortFunc(es, func(a, b effect) int { return a.at.Compare(b.at) })
		for k := 1; k < len(es); k++ {
			cause := repeatCause(es[k-1], es[k], outages)
			r.causes[cause]++
			if cause != "unexplained" {
				continue
			}
			unexplained++
			if unexplained <= 10 {
				r.problem("message %s took effect again without a cause: %s", messageID(id), describe(es))
			}
		}
	}
	if unexplained > 10 {
		r.problem("… %d unexplained repeats in all", unexplained)
	}
}

// repeatCause names why next repeated prev's effect.
func repeatCause(prev, next effect, outages []outage) string {
	if !prev.recorded {
		return "unrecorded"
	}
	for _, o := range outages {
		if o.forgets && o.start.After(prev.at) && o.start.Before(next.at) {
			return "forgotten by " + o.server
		}
	}
	return "unexplained"
}

func describe(es []effect) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = fmt.Sprintf("%s by %s recorded=%v", e.at.Format("15:04:05.000"), e.instance, e.recorded)
	}
	return strings.Join(parts, "; ")
}
