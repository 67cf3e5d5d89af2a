// Package claimtoken makes the ownership tokens of dedup claims, shared by the
// stores so that they agree on the format.
package claimtoken

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
)

// RandLen is the length of a token's random part, in hex digits.
const RandLen = 32

// New makes an unguessable token that also carries the fingerprint, so that
// a holder whose record expired or was swept (with nobody taking the key
// over) can still complete it with the fingerprint it claimed with.
func New(fingerprint string) string {
	var b [RandLen / 2]byte
	_, _ = rand.Read(b[:])
	var h [RandLen]byte
	hex.Encode(h[:], b[:])
	// One allocation per claim, where EncodeToString and the concatenation
	// made two.
	var t strings.Builder
	t.Grow(RandLen + len(fingerprint))
	t.Write(h[:])
	t.WriteString(fingerprint)
	return t.String()
}

// Fingerprint returns the fingerprint carried by token, and false for a
// malformed token.
func Fingerprint(token string) (string, bool) {
	if len(token) < RandLen {
		return "", false
	}
	return token[RandLen:], true
}
