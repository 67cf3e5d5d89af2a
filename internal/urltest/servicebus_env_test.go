// Talks to: no service. The Service Bus opener stops at the environment
// variable, before any dial.
package urltest

import (
	"strings"
	"testing"
)

// TestServiceBusConnEnvNeverShown (issue 23, defect 8): neither the
// variable conn_env names nor anything read from it is quoted.
func TestServiceBusConnEnvNeverShown(t *testing.T) {
	const set = "DEDUPQ_URLTEST_CONN_" + marker
	tests := []struct{ name, raw, cs string }{
		{"unset variable", "servicebus://ns.servicebus.windows.net/orders?window=10m&conn_env=" + marker, ""},
		{"empty variable", "servicebus://ns.servicebus.windows.net/orders?window=10m&conn_env=" + set, ""},
		{"another namespace", "servicebus://ns.servicebus.windows.net/orders?window=10m&conn_env=" + set,
			"Endpoint=sb://" + marker + ".servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=k"},
		{"another namespace, default variable", "servicebus://ns.servicebus.windows.net/orders?window=10m",
			"Endpoint=sb://" + marker + ".servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=k"},
		{"no endpoint", "servicebus://ns.servicebus.windows.net/orders?window=10m&conn_env=" + set, "SharedAccessKeyName=k;SharedAccessKey=k"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(set, tt.cs)
			t.Setenv("SERVICEBUS_CONNECTION_STRING", tt.cs)
			for what, err := range openAll(t, tt.raw) {
				if s := showsMarker(err); s != "" {
					t.Errorf("%s shows what conn_env named: %s", what, s)
				}
				if !strings.Contains(err.Error(), `parameter "conn_env"`) {
					t.Errorf("%s: %v, want it about conn_env", what, err)
				}
			}
		})
	}
}
