package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/window"
)

// policyFlags are the deployment's retry policy and dedup settings.
type policyFlags struct {
	file           string
	retry          window.RetryPolicy
	dedupTTL       time.Duration
	publisherSpan  time.Duration
	margin         float64
	ordered        bool
	groupBacklog   int
	retryFlagNames []string
}

func (f *policyFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.file, "policy", "", "JSON `file` of the settings below, keys in snake_case (max_attempts, max_backoff, dedup_ttl, …), durations as strings (\"10s\"); flags given override it")
	fs.IntVar(&f.retry.MaxAttempts, "max-attempts", 0, "publisher sends of one message, the first included (RetryPolicy.MaxAttempts; 0: the default's 5)")
	fs.DurationVar(&f.retry.InitialBackoff, "initial-backoff", 0, "wait after the first failed send (RetryPolicy.InitialBackoff; 0: the default backoff)")
	fs.DurationVar(&f.retry.MaxBackoff, "max-backoff", 0, "cap on any one wait (RetryPolicy.MaxBackoff)")
	fs.Float64Var(&f.retry.Multiplier, "multiplier", 0, "growth of the wait after each failed send (RetryPolicy.Multiplier)")
	fs.Float64Var(&f.retry.Jitter, "jitter", 0, "share of each wait drawn at random, in [0, 1] (RetryPolicy.Jitter)")
	fs.DurationVar(&f.retry.AttemptTimeout, "attempt-timeout", 0, "bound on one send (RetryPolicy.AttemptTimeout; 0: the default's 10s)")
	f.retryFlagNames = []string{"max-attempts", "initial-backoff", "max-backoff", "multiplier", "jitter", "attempt-timeout"}
	fs.DurationVar(&f.dedupTTL, "dedup-ttl", 0, "how long the consumers' dedup store remembers a key; declared to the publisher check as ConsumerDedupTTL (0: no consumer-side dedup)")
	fs.DurationVar(&f.publisherSpan, "publisher-span", 0, "the consumers' ConsumerOptions.PublisherSpan (0: the retry policy's worst-case span)")
	fs.Float64Var(&f.margin, "margin", 0, "share of a window or TTL kept free (0: the default 20%, negative: none)")
	fs.BoolVar(&f.ordered, "ordered", false, "the consumers run each group key in order (ConsumerOptions.Ordered): the check counts a resent copy's wait behind its group")
	fs.IntVar(&f.groupBacklog, "group-backlog", 0, "with --ordered: the most messages published to one group within the publisher span (ConsumerOptions.GroupBacklog)")
}

// options applies the policy file, under the flags given, and returns
// what dedupq.Inspect checks.
func (f *policyFlags) options(fs *flag.FlagSet) (dedupq.InspectOptions, error) {
	if f.file != "" {
		if err := f.readFile(fs); err != nil {
			return dedupq.InspectOptions{}, err
		}
	}
	var retry *window.RetryPolicy
	fs.Visit(func(fl *flag.Flag) {
		if slices.Contains(f.retryFlagNames, fl.Name) {
			retry = &f.retry
		}
	})
	if retry != nil {
		if err := retry.Validate(); err != nil {
			return dedupq.InspectOptions{}, err
		}
	}
	opts := dedupq.InspectOptions{
		Publisher: dedupq.PublisherOptions{Retry: retry, ConsumerDedupTTL: f.dedupTTL, Margin: f.margin},
		Consumer:  dedupq.ConsumerOptions{PublisherSpan: f.publisherSpan, Margin: f.margin, Ordered: f.ordered, GroupBacklog: f.groupBacklog},
		DedupTTL:  f.dedupTTL,
	}
	if !flagSet(fs, "publisher-span") {
		p := window.DefaultRetryPolicy()
		if retry != nil {
			p = retry.WithDefaults()
		}
		opts.Consumer.PublisherSpan = p.Span()
	}
	return opts, nil
}

// readFile sets every flag the file names and the command line does not,
// through the flag's own parser, so that the file and the flags read
// values alike.
func (f *policyFlags) readFile(fs *flag.FlagSet) error {
	data, err := os.ReadFile(f.file)
	if err != nil {
		return err
	}
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&fields); err != nil {
		return fmt.Errorf("policy file %s: %w", f.file, err)
	}
	for _, key := range sortedKeys(fields) {
		name := strings.ReplaceAll(key, "_", "-")
		if name == "policy" || name == "json" || name == "timeout" || fs.Lookup(name) == nil {
			return fmt.Errorf("policy file %s: unknown key %q", f.file, key)
		}
		if flagSet(fs, name) {
			continue
		}
		val := string(fields[key])
		var s string
		if json.Unmarshal(fields[key], &s) == nil {
			val = s
		}
		if err := fs.Set(name, val); err != nil {
			return fmt.Errorf("policy file %s: key %q: %w", f.file, key, err)
		}
	}
	return nil
}

func sortedKeys(m map[string]json.RawMessage) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// flagSet reports whether name was set, on the command line or by Set.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(fl *flag.Flag) { set = set || fl.Name == name })
	return set
}
