// Package need lets the tests of the example programs skip cleanly when a
// service they run against is absent, and fail under CI instead, where a
// missing service is a broken setup rather than a reason to pass.
package need

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"testing"
	"time"
)

// Service skips t, or fails it when the environment variable CI is set,
// unless something listens at addr (host:port). what names the service in
// the message.
func Service(t testing.TB, what, addr string) {
	t.Helper()
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(context.Background(), "tcp", addr)
	switch {
	case err == nil:
		c.Close()
	case os.Getenv("CI") != "":
		t.Fatalf("%s at %s is unreachable under CI: %v", what, addr, err)
	default:
		t.Skipf("%s at %s is unreachable (%v); skipping outside CI", what, addr, err)
	}
}

// Suffix returns a random suffix for the names of streams, queues, tables
// and keys a test creates on a shared service, so that parallel runs do
// not meet.
func Suffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
