package sqs

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/dedupq/dedupq/driver"
)

const (
	// MaxIDLength is SQS's limit on MessageDeduplicationId and
	// MessageGroupId, in characters (all allowed characters are ASCII, so
	// also in bytes).
	MaxIDLength = 128

	// HashPrefix starts every dedup ID that HashLongIDs produced. An
	// original ID that starts with it is itself hashed, so a hashed ID can
	// never collide with an ID sent as is.
	HashPrefix = "sha256:"

	// AttrID carries the original dedup ID when HashLongIDs replaced it,
	// so that consumers see the ID that was published.
	AttrID = "dedupq-id"

	// AttrBody says how the body was encoded when it could not travel as
	// SQS text: "base64" or "empty" (SQS refuses an empty body).
	AttrBody = "dedupq-body"

	// ReasonAttr carries, on a message Terminate moved to the dead-letter
	// queue, the handler's error (at most 256 bytes), for whoever
	// inspects the queue. Consumers of the dead-letter queue do not see it
	// among the attributes.
	ReasonAttr = "dedupq-terminate-reason"

	// ReservedAttrPrefix starts the names of the attributes the adapter
	// uses itself; user attributes with this prefix are refused.
	ReservedAttrPrefix = "dedupq-"

	// MaxAttributes is SQS's limit on message attributes per message.
	MaxAttributes = 10
)

// sqsPunct is the punctuation SQS accepts in dedup IDs and group keys.
const sqsPunct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"

// validIDChar reports whether SQS accepts r in a MessageDeduplicationId or
// MessageGroupId: ASCII letters, digits and punctuation.
func validIDChar(r rune) bool {
	return r < utf8.RuneSelf && (('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') ||
		('0' <= r && r <= '9') || strings.ContainsRune(sqsPunct, r))
}

// validID reports whether SQS accepts id as it is as a
// MessageDeduplicationId or MessageGroupId.
func validID(id string) bool {
	if id == "" || len(id) > MaxIDLength {
		return false
	}
	for _, r := range id {
		if !validIDChar(r) {
			return false
		}
	}
	return true
}

// HashID is the dedup ID HashLongIDs sends for an ID that SQS cannot take:
// HashPrefix followed by the lower-case hex SHA-256 of the ID's bytes (71
// characters). It is deterministic, so every resend of a message, from any
// process, carries the same dedup ID.
func HashID(id string) string {
	sum := sha256.Sum256([]byte(id))
	return HashPrefix + hex.EncodeToString(sum[:])
}

// wireID maps a dedup ID to the MessageDeduplicationId that is sent, and
// reports whether it was transformed. Without hashLong the ID must already
// be valid: the portable layer refused it otherwise.
func wireID(id string, hashLong bool) (string, bool) {
	if !hashLong {
		return id, false
	}
	if validID(id) && !strings.HasPrefix(id, HashPrefix) {
		return id, false
	}
	return HashID(id), true
}

// validBodyChar is SQS's rule for message body characters (XML 1.0's Char
// production).
func validBodyChar(r rune) bool {
	return r == 0x9 || r == 0xA || r == 0xD ||
		(0x20 <= r && r <= 0xD7FF) || (0xE000 <= r && r <= 0xFFFD) || (0x10000 <= r && r <= 0x10FFFF)
}

// encodeBody turns a body into SQS text. Bodies that are valid UTF-8 made of
// characters SQS accepts travel unchanged, so that other SQS consumers can
// read them; anything else (binary data, NUL, invalid UTF-8) travels as
// base64, and an empty body as a single space, each marked by AttrBody.
func encodeBody(b []byte) (body, encoding string) {
	_, encoding = bodyWireSize(b)
	return encodeBodyAs(b, encoding), encoding
}

// encodeBodyAs is encodeBody's text for b, whose marker bodyWireSize found
// to be encoding.
func encodeBodyAs(b []byte, encoding string) string {
	switch encoding {
	case "empty":
		return " "
	case "base64":
		return base64.StdEncoding.EncodeToString(b)
	}
	return string(b)
}

// bodyWireSize is the length of encodeBody(b) and its marker, without
// encoding it.
func bodyWireSize(b []byte) (size int, encoding string) {
	switch {
	case len(b) == 0:
		return 1, "empty"
	case validTextBytes(b):
		return len(b), ""
	}
	return base64.StdEncoding.EncodedLen(len(b)), "base64"
}

// decodeBody reverses encodeBody. A body whose marker is unknown or whose
// base64 is broken was not written by dedupq and is returned as it is.
func decodeBody(body, encoding string) []byte {
	switch encoding {
	case "empty":
		return []byte{}
	case "base64":
		if b, err := base64.StdEncoding.DecodeString(body); err == nil {
			return b
		}
	}
	return []byte(body)
}

// validAttrName applies SQS's rules for message attribute names, plus the
// reserved prefix (less the portable layer's own names, driver.Portable): up to 256 characters from A-Za-z0-9, '_', '-' and '.';
// no leading, trailing or doubled '.'; not starting with "AWS." or
// "Amazon." in any case.
func validAttrName(name string) bool {
	if name == "" || len(name) > 256 || (strings.HasPrefix(name, ReservedAttrPrefix) && !driver.Portable(name)) {
		return false
	}
	if name[0] == '.' || name[len(name)-1] == '.' || strings.Contains(name, "..") {
		return false
	}
	lower := strings.ToLower(name)
	if strings.HasPrefix(lower, "aws.") || strings.HasPrefix(lower, "amazon.") {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// emptyAttrType marks an attribute whose value was empty: SQS refuses empty
// attribute values, so a single space travels under this custom type.
const emptyAttrType = "String.dedupq-empty"

// encodeAttr turns a user attribute value into an SQS attribute value: text
// SQS accepts travels as a String; an empty value under emptyAttrType;
// anything else (invalid UTF-8 or characters SQS refuses) as Binary, which
// carries any bytes.
func encodeAttr(v string) types.MessageAttributeValue {
	switch {
	case v == "":
		return types.MessageAttributeValue{DataType: aws.String(emptyAttrType), StringValue: aws.String(" ")}
	case validText(v):
		return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
	}
	return types.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: []byte(v)}
}

// decodeAttr reverses encodeAttr, and reads attributes other SQS publishers
// wrote (Number, custom String and Binary types) as their text or bytes.
func decodeAttr(a types.MessageAttributeValue) string {
	dt := aws.ToString(a.DataType)
	switch {
	case dt == emptyAttrType:
		return ""
	case strings.HasPrefix(dt, "Binary"):
		return string(a.BinaryValue)
	}
	return aws.ToString(a.StringValue)
}

// valueWireSize is attrWireSize(name, encodeAttr(v)), without encoding v.
func valueWireSize(name, v string) int {
	switch {
	case v == "":
		return len(name) + len(emptyAttrType) + 1
	case validText(v):
		return len(name) + len("String") + len(v)
	}
	return len(name) + len("Binary") + base64.StdEncoding.EncodedLen(len(v))
}

// validTextBytes is validText for a byte slice, which it does not copy.
func validTextBytes(b []byte) bool {
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if (r == utf8.RuneError && n == 1) || !validBodyChar(r) {
			return false
		}
		b = b[n:]
	}
	return true
}

// validText reports whether s is valid UTF-8 made only of characters SQS
// accepts in bodies and String attribute values.
func validText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !validBodyChar(r) {
			return false
		}
	}
	return true
}
