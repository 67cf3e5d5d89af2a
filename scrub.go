package dedupq

import (
	"cmp"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// scrubbedError is an error from a backend opened or read through a URL,
// with what RedactURL hides of the URL taken out of its text. Drivers and
// their SDKs quote what they were given (the AWS SDK its endpoint, path
// included; an adapter the variable it read), and any of that may be a
// secret the URL's reader never meant to print. Unwrap returns the
// driver's error as it was, for errors.Is and errors.As.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// scrubber takes what RedactURL hides of one URL out of texts: re matches
// it, nil when nothing is hidden; whole hides every text, for when re
// could not be made.
type scrubber struct {
	re    *regexp.Regexp
	whole bool
}

// newScrubber returns the scrubber of u. It matches each hidden part in the
// forms a driver may quote it in (as written, decoded, escaped, and for a
// value that is itself a URL, its host and path), in any case, and as a
// whole word, so that a short hidden value does not eat words of the
// message around it.
func newScrubber(u *url.URL) scrubber {
	_, hidden := redact(u)
	var fs []string
	for _, h := range hidden {
		fs = append(fs, forms(h)...)
	}
	// A part of punctuation only ("/", "%2F") carries no secret, and
	// would eat the message's own.
	fs = slices.DeleteFunc(fs, func(f string) bool {
		if d, err := url.PathUnescape(f); err == nil {
			f = d
		}
		return !hasAlnum(f)
	})
	if len(fs) == 0 {
		return scrubber{}
	}
	// The longest first: the regexp takes the first alternative that
	// matches.
	slices.SortFunc(fs, func(a, b string) int { return cmp.Or(len(b)-len(a), strings.Compare(a, b)) })
	fs = slices.Compact(fs)
	alts := make([]string, len(fs))
	for i, f := range fs {
		alts[i] = regexp.QuoteMeta(runeErrors(f))
		if isWordByte(f[0]) {
			alts[i] = `\b` + alts[i]
		}
		if isWordByte(f[len(f)-1]) {
			alts[i] += `\b`
		}
	}
	re, err := regexp.Compile(`(?i)(?:` + strings.Join(alts, "|") + `)`)
	if err != nil {
		return scrubber{whole: true}
	}
	return scrubber{re: re}
}

// runeErrors is s with each byte that is not UTF-8 replaced by U+FFFD,
// which is what the regexp reads such a byte in a text as.
func runeErrors(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		b.WriteRune(r)
	}
	return b.String()
}

// forms lists the ways a driver may quote the hidden part h.
func forms(h string) []string {
	fs := []string{h}
	if d, err := url.QueryUnescape(h); err == nil {
		fs = append(fs, d)
	}
	if d, err := url.PathUnescape(h); err == nil {
		fs = append(fs, d)
	}
	for _, d := range slices.Clone(fs) {
		// Quoted with %q, as most error texts quote (url.Error does).
		q := strconv.Quote(d)
		fs = append(fs, url.QueryEscape(d), url.PathEscape(d), q[1:len(q)-1])
		if e, err := url.Parse(d); err == nil && e.Host != "" {
			// A URL (an endpoint): a client quotes it re-encoded, or its
			// host or path alone.
			pw, _ := e.User.Password()
			reenc := *e
			reenc.RawPath = ""
			fs = append(fs, e.String(), reenc.String(), e.Host, e.Hostname(), e.User.String(), e.User.Username(), pw,
				e.Path, e.EscapedPath(), reenc.EscapedPath(), strings.Trim(e.Path, "/"), e.RawQuery, e.Fragment)
		}
		if host, _, err := net.SplitHostPort(d); err == nil {
			fs = append(fs, host)
		}
	}
	return fs
}

func hasAlnum(s string) bool {
	return strings.IndexFunc(s, func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }) >= 0
}

func isWordByte(c byte) bool {
	return c == '_' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// text returns t with every hidden part replaced by Redacted.
func (s scrubber) text(t string) string {
	switch {
	case s.whole:
		return "(not shown: it may quote a part of the URL that is hidden)"
	case s.re == nil:
		return t
	}
	return s.re.ReplaceAllLiteralString(t, Redacted)
}

// err returns err with its text scrubbed, wrapping it.
func (s scrubber) err(err error) error {
	if err == nil || s.re == nil && !s.whole {
		return err
	}
	return &scrubbedError{msg: s.text(err.Error()), err: err}
}
