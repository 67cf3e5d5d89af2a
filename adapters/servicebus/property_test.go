package servicebus_test

// Service Bus's property quotas, through dedupq.Publisher against the
// Service Bus double (through the real azservicebus SDK), which enforces
// them as the service does: "Maximum message property size for each
// property is 32 KB. Cumulative size of all properties can't exceed 64 KB.
// This limit applies to the entire header of the brokered message, which
// has both user properties and system properties, such as sequence number,
// label, and message ID" — and then "The exception SerializationException
// is generated" for the whole transfer
// (https://learn.microsoft.com/azure/service-bus-messaging/service-bus-quotas,
// "Message property size for a queue, topic, or subscription entity").

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/servicebus"
	"github.com/dedupq/dedupq/driver"
)

// TestPropertyQuotas: a message over a property quota is refused before
// anything of its batch is sent, with a *dedupq.ValidationError on it, and
// the valid message beside it is not reported refused by the broker (it is
// not sent, ErrNotSent, as for any invalid batch); a message within both
// quotas is stored. Before, the batch went out, the broker refused the
// whole transfer, and the valid message was reported refused with it.
func TestPropertyQuotas(t *testing.T) {
	d := needDouble(t)
	kb := func(n int) string { return strings.Repeat("v", n<<10) }
	cases := []struct {
		name      string
		attrs     map[string]string
		wantValid bool
	}{
		{"one property over 32 KB", map[string]string{"big": kb(33)}, false},
		{"each property under 32 KB, over 64 KB in all", map[string]string{"p1": kb(20), "p2": kb(20), "p3": kb(20), "p4": kb(8)}, false},
		{"within both quotas", map[string]string{"p1": kb(30), "p2": kb(30)}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newFakeAdmin()
			q := newQueue(t, d, a, servicebus.EntityProperties{
				RequiresDuplicateDetection: true, DuplicateDetectionWindow: 10 * time.Minute,
				LockDuration: time.Minute, MaxDeliveryCount: 10,
			})
			tp, sub := openPair(t, newClient(t, d), q, servicebus.WithAdmin(servicebus.Options{}, a))
			defer sub.Close()
			p, err := dedupq.NewPublisher(t.Context(), tp, dedupq.PublisherOptions{})
			if err != nil {
				t.Fatalf("NewPublisher: %v", err)
			}
			defer p.Close(t.Context())
			msgs := []*dedupq.Message{
				{ID: "valid", Body: []byte("ok"), Attributes: map[string]string{"k": "v"}},
				{ID: "tested", Body: []byte("x"), Attributes: tc.attrs},
			}
			_, err = p.PublishBatch(t.Context(), msgs)
			if tc.wantValid {
				if err != nil {
					t.Fatalf("PublishBatch: %v, want both stored", err)
				}
				receiveN(t, sub, 2)
				return
			}
			var be *dedupq.BatchError
			if !errors.As(err, &be) || len(be.Failed) != 2 {
				t.Fatalf("PublishBatch: %v, want a *BatchError on both messages", err)
			}
			var ve *dedupq.ValidationError
			if !errors.As(be.Failed[1], &ve) || ve.Field != "Attributes" || ve.Backend != servicebus.Backend {
				t.Errorf("the message over the quota: %v, want a *dedupq.ValidationError on Attributes from %s", be.Failed[1], servicebus.Backend)
			}
			if !errors.Is(be.Failed[0], dedupq.ErrNotSent) {
				t.Errorf("the valid message: %v, want ErrNotSent (nothing of an invalid batch is sent), not a broker refusal", be.Failed[0])
			}
			receiveN(t, sub, 0)
		})
	}
}

// TestCheckProperties: the quotas as Topic.Limits().Check applies them,
// without a broker; the error names the attribute, never its value.
func TestCheckProperties(t *testing.T) {
	val := func(n int) string { return strings.Repeat("s3cr3t", n/6+1)[:n] }
	cases := []struct {
		name     string
		attrs    map[string]string
		wantProp string // "" ok, "-" the header, else the attribute refused
	}{
		{"no attributes", nil, ""},
		{"a property under 32 KB with its encoding", map[string]string{"p": val(32<<10 - 100)}, ""},
		{"a 32 KB value", map[string]string{"p": val(32 << 10)}, "p"},
		{"the name counts", map[string]string{val(16 << 10): val(16 << 10)}, val(16 << 10)},
		{"under 64 KB in all, with room for the broker's", map[string]string{"a": val(31 << 10), "b": val(31 << 10)}, ""},
		{"over 64 KB in all", map[string]string{"a": val(22 << 10), "b": val(22 << 10), "c": val(22 << 10)}, "-"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := &driver.Message{ID: "id", GroupKey: "g", Body: []byte("x"), Attributes: tc.attrs}
			field, err := servicebus.CheckProperties(m)
			if tc.wantProp == "" {
				if err != nil {
					t.Fatalf("CheckProperties: %v, want nil", err)
				}
				return
			}
			var qe *servicebus.PropertyQuotaError
			if !errors.As(err, &qe) || field != "Attributes" {
				t.Fatalf("CheckProperties: %q, %v, want Attributes and a *PropertyQuotaError", field, err)
			}
			want, limit := tc.wantProp, servicebus.MaxPropertyBytes
			if want == "-" {
				want, limit = "", servicebus.MaxHeaderBytes
			}
			if qe.Property != want || qe.Limit != limit || qe.Bytes <= limit {
				t.Errorf("got %+v, want property %q over %d", qe, want, limit)
			}
			if !strings.Contains(want, "s3cr3t") && strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("the error quotes a value: %v", err)
			}
		})
	}
}
