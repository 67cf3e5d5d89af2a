package dedupq

import (
	"fmt"
	"unicode/utf8"

	"github.com/dedupq/dedupq/driver"
)

// validate checks m against the backend's limits; it returns nil or a
// *ValidationError.
func validate(backend string, lim driver.Limits, index int, m *driver.Message) error {
	bad := func(field, format string, args ...any) error {
		return &ValidationError{Index: index, ID: m.ID, Field: field, Reason: fmt.Sprintf(format, args...), Backend: backend}
	}
	if err := checkKey(lim.MaxIDLength, lim.IDAllowed, m.ID); err != "" {
		return bad("ID", "%s (%s)", err, backend)
	}
	if m.GroupKey == "" && lim.GroupKeyRequired {
		return bad("GroupKey", "%s requires a group key", backend)
	}
	if m.GroupKey != "" {
		allowed := lim.GroupKeyAllowed
		if allowed == nil {
			allowed = lim.IDAllowed
		}
		if err := checkKey(lim.MaxGroupKeyLength, allowed, m.GroupKey); err != "" {
			return bad("GroupKey", "%s (%s)", err, backend)
		}
	}
	if lim.MaxAttributes > 0 && len(m.Attributes) > lim.MaxAttributes {
		return bad("Attributes", "%d attributes, %s accepts at most %d", len(m.Attributes), backend, lim.MaxAttributes)
	}
	for k, v := range m.Attributes {
		// The portable layer's own names are the driver's to carry, even
		// where the driver refuses its reserved prefix from users.
		if k == "" || (lim.AttributeNameAllowed != nil && !driver.Portable(k) && !lim.AttributeNameAllowed(k)) {
			return bad("Attributes", "attribute name %q is not accepted by %s", k, backend)
		}
		if lim.MaxAttributeValueBytes > 0 && len(v) > lim.MaxAttributeValueBytes {
			return bad("Attributes", "attribute %q is %d bytes, %s accepts at most %d", k, len(v), backend, lim.MaxAttributeValueBytes)
		}
	}
	if lim.MaxMessageBytes > 0 && m.Size() > lim.MaxMessageBytes {
		return bad("Body", "message is %d bytes (body plus attributes), %s accepts at most %d", m.Size(), backend, lim.MaxMessageBytes)
	}
	if lim.Check != nil {
		if field, err := lim.Check(m); err != nil {
			ve := bad(field, "%v", err).(*ValidationError)
			ve.Err = err
			return ve
		}
	}
	return nil
}

// checkReserved refuses user attributes under dedupq's reserved prefix:
// the portable layer and the drivers put their own attributes there
// (driver.AttrTraceParent, …), and a user's would be overwritten or
// dropped.
func checkReserved(backend string, index int, m *driver.Message) error {
	for k := range m.Attributes {
		if reservedName(k) {
			return &ValidationError{Index: index, ID: m.ID, Field: "Attributes", Backend: backend,
				Reason: fmt.Sprintf("attribute name %q is reserved: names starting with %q are dedupq's own", k, reservedAttrPrefix)}
		}
	}
	return nil
}

// checkKey returns "" for a valid ID or group key, else what is wrong.
func checkKey(maxLen int, allowed func(rune) bool, s string) string {
	switch {
	case s == "":
		return "empty"
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case maxLen > 0 && len(s) > maxLen:
		return fmt.Sprintf("%d bytes, at most %d allowed", len(s), maxLen)
	}
	if allowed != nil {
		for i, r := range s {
			if !allowed(r) {
				return fmt.Sprintf("character %q at byte %d is not allowed", r, i)
			}
		}
	}
	return ""
}

// Validate checks msgs against what every backend requires (a non-empty,
// valid UTF-8 ID; a valid group key when one is given), without a
// Publisher: nil, or a *BatchError listing each invalid message as a
// *ValidationError. Publisher.Validate also checks the backend's limits.
func Validate(msgs ...*Message) error {
	var failed []error
	for i, m := range msgs {
		if m == nil {
			m = &Message{}
		}
		var dm driver.Message
		toDriverMessage(m, &dm)
		if err := validate("", driver.Limits{}, i, &dm); err != nil {
			failed = append(failed, err)
		}
	}
	if failed != nil {
		return &BatchError{Total: len(msgs), Failed: failed}
	}
	return nil
}
