package jetstream

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/driver"
)

const (
	// MaxIDLength is the longest dedup ID this backend accepts, in bytes.
	// NATS sets no limit of its own, but the server keeps every ID it has
	// seen in memory for the whole window, so the cap bounds that memory
	// per message. 256 is twice what SQS and Service Bus allow (128), so
	// every ID that is portable to them fits, as do a SHA-256 in hex (64)
	// and composite keys such as "tenant:order:line".
	MaxIDLength = 256
	// MaxGroupKeyLength bounds a GroupKey, which becomes a subject token;
	// the whole protocol line that carries the subject is limited to 4 KiB.
	MaxGroupKeyLength = 256
	// MaxAttributes bounds the headers a message carries for its
	// attributes. NATS sets no limit, but the per-header framing must be
	// counted against max_payload before sending, which needs a bound.
	MaxAttributes = 64
)

// Header framing as the client writes it: "NATS/1.0\r\n", then "Key: Value\r\n"
// per header, then "\r\n".
const (
	hdrFrame     = len("NATS/1.0\r\n") + len("\r\n")
	hdrPerHeader = len(": \r\n")
)

// idRune admits printable ASCII except space. Header values are ASCII by
// the NATS protocol (ADR-4), and the Go client trims leading and trailing
// whitespace and turns CR and LF into spaces: an ID with such characters
// would be changed in flight, and two different IDs could collide.
func idRune(r rune) bool { return r > ' ' && r < 0x7f }

// groupRune is idRune without the subject separators and wildcards, since
// a GroupKey becomes one subject token.
func groupRune(r rune) bool { return idRune(r) && r != '.' && r != '*' && r != '>' }

// attributeNameAllowed admits the header names the client accepts
// (printable ASCII without the separators in ADR-4) that have no meaning to
// NATS itself: not "Nats-…", which the server and client interpret, nor
// "Status" and "Description", which mark a control message when the body
// is empty.
func attributeNameAllowed(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"()/,:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return !reservedHeader(name)
}

func reservedHeader(name string) bool {
	return len(name) >= 5 && strings.EqualFold(name[:5], "nats-") ||
		strings.EqualFold(name, "Status") || strings.EqualFold(name, "Description")
}

// valueProblem says why v cannot travel unchanged as a header value.
func valueProblem(v string) string {
	if strings.ContainsAny(v, "\r\n") {
		return "contains CR or LF"
	}
	if v != strings.Trim(v, " \t") {
		return "starts or ends with a space or tab"
	}
	return ""
}

// limits are this backend's rules for a stream named stream on a
// connection whose messages may be maxPayload bytes in all.
func limits(stream string, maxPayload int64) driver.Limits {
	// Size() counts the body and attribute names and values; everything
	// else in the message must fit in what is left.
	overhead := hdrFrame +
		len(jetstream.MsgIDHeader) + hdrPerHeader + MaxIDLength +
		len(jetstream.ExpectedStreamHeader) + hdrPerHeader + len(stream) +
		MaxAttributes*hdrPerHeader
	return driver.Limits{
		MaxIDLength:          MaxIDLength,
		IDAllowed:            idRune,
		MaxMessageBytes:      max(int(maxPayload)-overhead, 1),
		MaxAttributes:        MaxAttributes,
		MaxGroupKeyLength:    MaxGroupKeyLength,
		GroupKeyAllowed:      groupRune,
		AttributeNameAllowed: attributeNameAllowed,
		Check:                checkValues,
	}
}

// checkValues refuses attribute values a NATS header cannot carry
// unchanged, so that dedupq.Publisher reports them as a ValidationError
// before anything is sent.
func checkValues(m *driver.Message) (string, error) {
	for k, v := range m.Attributes {
		if r := valueProblem(v); r != "" {
			return "Attributes", &refusedError{fmt.Sprintf("attribute %q: value %s, which a NATS header cannot carry unchanged", k, r)}
		}
	}
	return "", nil
}

// refusedError is a message this driver will not send because it cannot
// arrive unchanged. Nothing was sent, and a resend cannot help.
type refusedError struct{ reason string }

func (e *refusedError) Error() string {
	return "jetstream: message refused before sending: " + e.reason
}

// checkMessage repeats the checks dedupq.Publisher makes from Limits, plus
// what Limits cannot say (header values), so that SendBatch called
// directly never sends a message that would arrive changed.
func checkMessage(m *driver.Message) error {
	bad := func(format string, args ...any) error { return &refusedError{fmt.Sprintf(format, args...)} }
	if m.ID == "" || len(m.ID) > MaxIDLength || strings.IndexFunc(m.ID, func(r rune) bool { return !idRune(r) }) >= 0 {
		return bad("ID %q: want 1 to %d printable ASCII characters without spaces", m.ID, MaxIDLength)
	}
	if m.GroupKey != "" && (len(m.GroupKey) > MaxGroupKeyLength || strings.IndexFunc(m.GroupKey, func(r rune) bool { return !groupRune(r) }) >= 0) {
		return bad("GroupKey %q: want up to %d printable ASCII characters without spaces, '.', '*' or '>'", m.GroupKey, MaxGroupKeyLength)
	}
	if len(m.Attributes) > MaxAttributes {
		return bad("%d attributes, at most %d", len(m.Attributes), MaxAttributes)
	}
	for k, v := range m.Attributes {
		if !attributeNameAllowed(k) {
			return bad("attribute name %q is not a usable NATS header name", k)
		}
		if r := valueProblem(v); r != "" {
			return bad("attribute %q: value %s, which a NATS header cannot carry unchanged", k, r)
		}
	}
	return nil
}

// toNATS builds the NATS message for m, published to subject (plus the
// group suffix), with the dedup ID and, so that the stream whose window
// was checked is the one that stores it, the expected stream as headers.
// Every header value shares one backing array: one allocation for all of
// them, not one each.
func toNATS(subject, stream string, m *driver.Message) *nats.Msg {
	if m.GroupKey != "" {
		subject += "." + m.GroupKey
	}
	vals := make([]string, 2+len(m.Attributes))
	h := make(nats.Header, len(vals))
	vals[0], vals[1] = m.ID, stream
	h[jetstream.MsgIDHeader] = vals[0:1:1]
	h[jetstream.ExpectedStreamHeader] = vals[1:2:2]
	i := 2
	for k, v := range m.Attributes {
		vals[i] = v
		h[k] = vals[i : i+1 : i+1]
		i++
	}
	return &nats.Msg{Subject: subject, Header: h, Data: m.Body}
}

// fromNATS reads a consumed message back into a driver message. Headers
// the server or client own are left out; a header with several values
// (from a publisher other than dedupq) yields its first. A message without
// a Nats-Msg-Id gets fallbackID as its ID. groupPrefix is the topic's
// subject and a dot: what follows it is the GroupKey.
func fromNATS(groupPrefix string, m jetstream.Msg) driver.Message {
	h := m.Headers()
	out := driver.Message{ID: h.Get(jetstream.MsgIDHeader), Body: m.Data()}
	if out.ID == "" {
		out.ID = fallbackID(m)
	}
	for k, vs := range h {
		if len(vs) == 0 || reservedHeader(k) {
			continue
		}
		if out.Attributes == nil {
			out.Attributes = make(map[string]string, len(h))
		}
		out.Attributes[k] = vs[0]
	}
	if rest, ok := strings.CutPrefix(m.Subject(), groupPrefix); ok {
		out.GroupKey = rest
	}
	return out
}

// fallbackID is the dedup key of a message stored without a Nats-Msg-Id
// (sent by "nats pub", by another service, or copied into a sourced
// stream): "stream <name> seq <stream sequence> time <stored time in Unix
// nanoseconds>", from the delivery's metadata. Every redelivery of the
// stored message carries the same three, unlike the consumer sequence,
// which counts deliveries; the stream name keeps apart streams whose
// consumers share a dedup store, and the stored time keeps apart the
// messages of a stream that was deleted and created again, whose sequence
// starts over. The spaces keep it apart from every ID a dedupq Publisher
// can send (idRune refuses them). Without metadata (not a JetStream
// message) it is "", which the dedup Guard refuses rather than share.
func fallbackID(m jetstream.Msg) string {
	meta, err := m.Metadata()
	if err != nil || meta.Stream == "" {
		return ""
	}
	return fmt.Sprintf("stream %s seq %d time %d", meta.Stream, meta.Sequence.Stream, meta.Timestamp.UnixNano())
}

// ackReplyFields reads the delivery count and the stream sequence from a
// delivery's reply subject, as the client's Metadata does, without its
// allocations: seq is the sequence as the server wrote it, a part of
// reply. ok is false when reply is not a JetStream ack subject, one of
//
//	$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>
//	$JS.ACK.<domain>.<account hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>[.<token>…]
func ackReplyFields(reply string) (delivered uint64, seq string, ok bool) {
	rest, ok := strings.CutPrefix(reply, "$JS.ACK.")
	if !ok {
		return 0, "", false
	}
	skip := 2 // stream, consumer
	switch n := strings.Count(rest, ".") + 1; {
	case n == 7:
	case n >= 9:
		skip = 4 // domain, account hash, stream, consumer
	default:
		return 0, "", false
	}
	for range skip {
		_, rest, _ = strings.Cut(rest, ".")
	}
	d, rest, _ := strings.Cut(rest, ".")
	seq, _, _ = strings.Cut(rest, ".")
	delivered, err := strconv.ParseUint(d, 10, 64)
	if err != nil {
		return 0, "", false
	}
	if _, err := strconv.ParseUint(seq, 10, 64); err != nil {
		return 0, "", false
	}
	return delivered, seq, true
}
