package jetstream

// The README's "Tested server versions" paragraph against the servers this
// package's tests run on: the embedded server (go.mod's nats-server) and
// the local server at 127.0.0.1:4222, each asked for its version over a
// real connection. A server upgraded, on the machine or in go.mod, fails
// this test until the README says so.

import (
	"os"
	"strings"
	"testing"
)

func TestREADMENamesServerVersions(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const head = "Tested server versions:"
	_, rest, ok := strings.Cut(string(readme), head)
	if !ok {
		t.Fatalf("README.md has no paragraph starting %q", head)
	}
	para, _, _ := strings.Cut(rest, "\n\n")
	para = strings.Join(strings.Fields(para), " ")
	forEachServer(t, func(t *testing.T, srv server) {
		v := connect(t, srv).ConnectedServerVersion()
		t.Logf("the %s server is nats-server %s", srv.name, v)
		if !strings.Contains(para, "nats-server "+v+" ") {
			t.Errorf("the %s server is nats-server %s; README's %q does not name it:\n%s", srv.name, v, head, para)
		}
	})
}
