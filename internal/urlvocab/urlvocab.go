// Package urlvocab is the URL parameter vocabulary of the backends in this
// module: which scheme takes which parameter, and the names brokers (or
// earlier dedupq versions) use for the same settings. dedupq.QueryParams
// uses it to answer an unknown parameter with a hint, even when the backend
// the name belongs to is not linked into the program, which is when a
// user who pasted another backend's URL needs it most.
//
// The tables are never written; the functions return copies. The
// cross-adapter tests in internal/urltest check them against what each
// adapter accepts and against the README's parameter table.
package urlvocab

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// byScheme lists every parameter of every scheme of this module, portable
// ones (the same concept under the same name on every backend that has
// it) first.
var byScheme = map[string][]string{
	"mem":        {"window", "ack_wait", "max_deliveries", "backoff", "seed", "dup_publish", "dup_delivery", "lost_ack"},
	"jetstream":  {"window", "ack_wait", "max_deliveries", "backoff", "max_batch", "subject", "durable", "create", "storage"},
	"sqs":        {"ack_wait", "backoff", "region", "endpoint", "group", "hash_long_ids", "wait_time", "terminate", "delete_linger", "create", "max_deliveries"},
	"servicebus": {"window", "ack_wait", "max_deliveries", "max_batch", "conn_env", "kind", "max_message_bytes"},
	"pubsub":     {"emulator", "publish_timeout", "ack_wait", "max_extension", "max_outstanding"},
}

// renamed maps a broker's own name for a setting, or a name an earlier
// dedupq version used, to the name dedupq URLs use for it. Keys are
// normalized (see normalize). Spellings that differ from a current name
// only in case and separators (ackwait, maxdeliveries, maxbatch) need no
// entry.
var renamed = map[string]struct{ name, origin string }{
	"duplicates":                          {"window", "JetStream's Duplicates"},
	"duplicatedetectionhistorytimewindow": {"window", "Service Bus's DuplicateDetectionHistoryTimeWindow"},
	"visibilitytimeout":                   {"ack_wait", "SQS's VisibilityTimeout"},
	"lockduration":                        {"ack_wait", "Service Bus's LockDuration"},
	"ackextension":                        {"ack_wait", "pubsub's former ack_extension"},
	"ackdeadline":                         {"ack_wait", "Pub/Sub's ack deadline"},
	"maxdeliver":                          {"max_deliveries", "JetStream's MaxDeliver"},
	"maxdeliverycount":                    {"max_deliveries", "Service Bus's MaxDeliveryCount"},
	"maxreceivecount":                     {"max_deliveries", "SQS's maxReceiveCount"},
	"nackbackoff":                         {"backoff", "sqs's former nack_backoff"},
}

// Schemes returns the schemes of this module, sorted.
func Schemes() []string {
	var s []string
	for k := range byScheme {
		s = append(s, k)
	}
	slices.Sort(s)
	return s
}

// Params returns the parameters scheme takes, portable ones first, or nil
// for a scheme not of this module.
func Params(scheme string) []string { return slices.Clone(byScheme[scheme]) }

// normalize folds case and drops the separators people put between
// words, so that Window, ackWait, ack-wait and ACK_WAIT meet.
func normalize(name string) string {
	return strings.NewReplacer("_", "", "-", "", ".", "").Replace(strings.ToLower(name))
}

// schemeRE matches what may be shown as a scheme's name.
var schemeRE = regexp.MustCompile(`^[a-z][a-z0-9+.-]{0,31}$`)

// Hint says what a user who wrote the unknown parameter name on scheme,
// whose parameters are known, probably meant: a known name that differs
// only in case or separators, the name dedupq uses for a broker's setting
// or for an earlier spelling, or the other schemes that take the name. It
// returns "" when it has nothing to say.
//
// The hint names only parameters of the tables and of known, and the
// scheme when it looks like one: never name itself, which the caller shows
// or hides, and never a value.
func Hint(scheme, name string, known []string) string {
	n := normalize(name)
	for _, k := range known {
		if normalize(k) == n {
			return fmt.Sprintf("did you mean %s? parameter names are lower-case snake_case", k)
		}
	}
	target, note := "", ""
	if r, ok := renamed[n]; ok {
		target = r.name
		if slices.Contains(known, r.name) {
			return fmt.Sprintf("did you mean %s? %s is %s here", r.name, r.origin, r.name)
		}
		note = fmt.Sprintf("; %s is %s in dedupq URLs", r.origin, r.name)
	}
	if target == "" {
		target = vocabularyName(n)
	}
	if target == "" {
		return ""
	}
	if !schemeRE.MatchString(scheme) {
		scheme = "this scheme"
	}
	return fmt.Sprintf("%s is a %s parameter; %s has no such parameter%s", target, list(takes(target)), scheme, note)
}

// vocabularyName returns the parameter of any scheme whose normalized
// name is n, or "".
func vocabularyName(n string) string {
	for _, s := range Schemes() {
		for _, p := range byScheme[s] {
			if normalize(p) == n {
				return p
			}
		}
	}
	return ""
}

// takes returns the schemes that take name, sorted.
func takes(name string) []string {
	var s []string
	for _, scheme := range Schemes() {
		if slices.Contains(byScheme[scheme], name) {
			s = append(s, scheme)
		}
	}
	return s
}

// list writes "a", "a and b", "a, b and c".
func list(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
