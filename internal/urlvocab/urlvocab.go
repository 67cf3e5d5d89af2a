// Package urlvocab is the URL parameter vocabulary of the backends in this
// module: which scheme takes which parameter, and the names brokers (or
// earlier dedupq versions) use for the same settings. dedupq.QueryParams
// uses it to answer an unknown parameter with a hint, even when the backend
// the name belongs to is not linked into the program, which is when a
// user who pasted another backend's URL needs it most. dedupq.RedactURL
// uses it to show the values a user needs to read back and that carry no
// secret.
//
// The tables are never written; the functions return copies. The
// cross-adapter tests in internal/urltest check them against what each
// adapter accepts and against the README's parameter table.
package urlvocab

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// byScheme lists every parameter of every scheme of this module, portable
// ones (the same concept under the same name on every backend that has
// it) first, with the kind of its values.
var byScheme = map[string][]param{
	"mem": {{"window", duration}, {"ack_wait", duration}, {"max_deliveries", count}, {"backoff", durations}, {"seed", count},
		{"dup_publish", probability}, {"dup_delivery", probability}, {"lost_ack", probability}},
	"jetstream": {{"window", duration}, {"ack_wait", duration}, {"max_deliveries", count}, {"backoff", durations}, {"max_batch", count},
		{"subject", subject}, {"durable", name}, {"create", boolean}, {"storage", oneOf("file", "memory")}},
	"sqs": {{"ack_wait", duration}, {"backoff", durations}, {"region", region}, {"endpoint", secret}, {"group", name},
		{"hash_long_ids", boolean}, {"wait_time", duration}, {"terminate", oneOf("dlq", "delete")}, {"delete_linger", duration},
		{"create", boolean}, {"max_deliveries", count}},
	"servicebus": {{"window", durationOr("none")}, {"ack_wait", duration}, {"max_deliveries", count}, {"max_batch", count},
		{"conn_env", secret}, {"kind", oneOf("queue", "topic")}, {"max_message_bytes", count},
		{"create", boolean}, {"sessions", boolean}, {"session_idle", duration}},
	"pubsub": {{"emulator", secret}, {"publish_timeout", duration}, {"ack_wait", duration}, {"max_extension", duration}, {"max_outstanding", count}},
}

// param is one parameter of a scheme.
type param struct {
	name string
	// harmless reports whether a value is one that cannot carry a secret
	// (a duration, a count) or is a name under the broker's rules; nil
	// (secret) means the parameter may carry one, whatever its value: an
	// endpoint, a variable's name.
	harmless func(string) bool
}

var (
	// secret marks a parameter whose value is never shown.
	secret func(string) bool

	duration = func(v string) bool {
		_, err := time.ParseDuration(v)
		return err == nil
	}
	durations = func(v string) bool {
		for d := range strings.SplitSeq(v, ",") {
			if !duration(d) {
				return false
			}
		}
		return true
	}
	count       = regexp.MustCompile(`^-?[0-9]{1,20}$`).MatchString
	probability = func(v string) bool {
		p, err := strconv.ParseFloat(v, 64)
		return err == nil && p >= 0 && p <= 1 && floatRE.MatchString(v)
	}
	floatRE = regexp.MustCompile(`^[0-9.eE+-]{1,32}$`)
	boolean = func(v string) bool {
		_, err := strconv.ParseBool(v)
		return err == nil
	}
	// name and subject are stricter than the brokers' own rules (JetStream
	// takes most printable ASCII): the characters of base64, key=value
	// lists and escapes, which a pasted key has, are hidden.
	name    = regexp.MustCompile(`^[A-Za-z0-9_-]{1,255}$`).MatchString
	subject = regexp.MustCompile(`^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`).MatchString
	region  = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]{1,2}$`).MatchString
)

// oneOf is the kind of a parameter that takes one of words.
func oneOf(words ...string) func(string) bool {
	return func(v string) bool { return slices.Contains(words, v) }
}

// durationOr is the kind of a duration that may also be one of words.
func durationOr(words ...string) func(string) bool {
	return func(v string) bool { return duration(v) || slices.Contains(words, v) }
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
func Params(scheme string) []string {
	var names []string
	for _, p := range byScheme[scheme] {
		names = append(names, p.name)
	}
	return names
}

// Shown reports whether the value of parameter name on scheme may be
// printed: the parameter is one of scheme's, not one that may carry a
// secret (an endpoint, a variable's name), and value is of its kind (a
// duration, a count, a boolean, one of its words, or a name under the
// broker's rules). A value that fails its kind's check is not shown,
// since a secret pasted into the wrong parameter fails it too, and so is
// a too long one.
func Shown(scheme, name, value string) bool {
	if len(value) > 255 {
		return false
	}
	for _, p := range byScheme[scheme] {
		if p.name == name {
			return p.harmless != nil && p.harmless(value)
		}
	}
	return false
}

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
			if normalize(p.name) == n {
				return p.name
			}
		}
	}
	return ""
}

// takes returns the schemes that take name, sorted.
func takes(name string) []string {
	var s []string
	for _, scheme := range Schemes() {
		if slices.Contains(Params(scheme), name) {
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
