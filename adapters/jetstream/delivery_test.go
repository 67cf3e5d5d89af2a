package jetstream

// Conversion of a consumed message into a driver delivery, on a stand-in
// for the client's message; no server.

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dedupq/dedupq/driver"
)

// fakeMsg is a consumed message as the client hands it out: the fields
// delivery reads, and Metadata as the client computes it from the reply
// subject (one allocation, like the client's).
type fakeMsg struct {
	jetstream.Msg
	subject, reply string
	header         nats.Header
	data           []byte
}

func (m *fakeMsg) Subject() string      { return m.subject }
func (m *fakeMsg) Reply() string        { return m.reply }
func (m *fakeMsg) Headers() nats.Header { return m.header }
func (m *fakeMsg) Data() []byte         { return m.data }
func (m *fakeMsg) Metadata() (*jetstream.MsgMetadata, error) {
	meta := &jetstream.MsgMetadata{Stream: "S", NumDelivered: 3, Timestamp: time.Unix(0, 1700000000000000000)}
	meta.Sequence.Stream = 123456
	return meta, nil
}

func TestDeliveryFromReply(t *testing.T) {
	const subject = "orders.created"
	sub := &Subscription{cfg: Config{Subject: subject}, groupPrefix: subject + "."}
	sub.consCfg.AckWait = 7 * time.Second
	for _, tc := range []struct {
		name, reply, msgSubject string
		header                  nats.Header
		attempt                 int
		backendID, id, group    string
	}{
		{"v1 reply", "$JS.ACK.S.worker.3.123456.98.1700000000000000000.5", subject + ".eu",
			nats.Header{jetstream.MsgIDHeader: {"id-1"}}, 3, "123456", "id-1", "eu"},
		{"v2 reply", "$JS.ACK._.ACCHASH.S.worker.2.77.98.1700000000000000000.5.rnd", subject,
			nats.Header{jetstream.MsgIDHeader: {"id-2"}, "Custom": {"v"}}, 2, "77", "id-2", ""},
		{"v2 reply without the last token", "$JS.ACK.dom.ACCHASH.S.worker.1.9.98.1700000000000000000.0", subject,
			nats.Header{jetstream.MsgIDHeader: {"id-3"}}, 1, "9", "id-3", ""},
		{"not a JetStream reply", "_INBOX.x", subject, nats.Header{jetstream.MsgIDHeader: {"id-4"}}, 1, "", "id-4", ""},
		{"bad token count", "$JS.ACK.S.worker.3.123456", subject, nats.Header{jetstream.MsgIDHeader: {"id-5"}}, 1, "", "id-5", ""},
		{"bad number", "$JS.ACK.S.worker.x.123456.98.1700000000000000000.5", subject, nats.Header{jetstream.MsgIDHeader: {"id-6"}}, 1, "", "id-6", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := new(driver.Delivery)
			sub.fill(d, &fakeMsg{subject: tc.msgSubject, reply: tc.reply, header: tc.header, data: []byte("x")})
			if d.Attempt != tc.attempt || d.BackendID != tc.backendID || d.Message.ID != tc.id || d.Message.GroupKey != tc.group {
				t.Errorf("delivery: attempt %d, backend ID %q, ID %q, group %q; want %d, %q, %q, %q",
					d.Attempt, d.BackendID, d.Message.ID, d.Message.GroupKey, tc.attempt, tc.backendID, tc.id, tc.group)
			}
			if d.Lease != 7*time.Second {
				t.Errorf("lease %s, want the AckWait 7s", d.Lease)
			}
			if v, ok := tc.header["Custom"]; ok && d.Message.Attributes["Custom"] != v[0] {
				t.Errorf("attributes %v, want Custom=%s", d.Message.Attributes, v[0])
			}
		})
	}
}

// TestDeliveryAllocations: converting a delivery with a dedup ID and no
// attributes allocates nothing; the Delivery itself comes from a block
// (TestDeliveriesOfAPull). Before, the client's Metadata, the formatted
// sequence and the group prefix cost three allocations.
func TestDeliveryAllocations(t *testing.T) {
	const subject = "bench.BENCH_0123456789abcdef"
	sub := &Subscription{cfg: Config{Subject: subject}, groupPrefix: subject + "."}
	m := &fakeMsg{subject: subject, reply: "$JS.ACK.S.bench.1." + strconv.Itoa(1234567) + ".1.1700000000000000000.0",
		header: nats.Header{jetstream.MsgIDHeader: {"m123"}}, data: payload}
	var d driver.Delivery
	if n := testing.AllocsPerRun(100, func() { sub.fill(&d, m) }); n > 0 {
		t.Errorf("%.0f allocations per delivery, want none", n)
	}
}

// TestDeliveriesOfAPull: the deliveries of one pull come out in order,
// one per message, whether the client had them all buffered or hands them
// over one by one; a pull of 64 buffered messages costs the slice and one
// block of Deliveries (and the test's channel, two), not an allocation per
// message (70 before).
func TestDeliveriesOfAPull(t *testing.T) {
	const subject = "bench.S"
	sub := &Subscription{cfg: Config{Subject: subject}, groupPrefix: subject + "."}
	sub.consCfg.AckWait = 7 * time.Second
	msgs := make([]jetstream.Msg, 64)
	for i := range msgs {
		msgs[i] = &fakeMsg{subject: subject, reply: "$JS.ACK.S.bench.1." + strconv.Itoa(i+1) + ".1.1700000000000000000.0",
			header: nats.Header{jetstream.MsgIDHeader: {"m" + strconv.Itoa(i)}}, data: payload}
	}
	buffered := func(n int) <-chan jetstream.Msg {
		ch := make(chan jetstream.Msg, n)
		for _, m := range msgs[:n] {
			ch <- m
		}
		close(ch)
		return ch
	}
	trickling := func(n int) <-chan jetstream.Msg {
		ch := make(chan jetstream.Msg)
		go func() {
			defer close(ch)
			for _, m := range msgs[:n] {
				ch <- m
			}
		}()
		return ch
	}
	for _, tc := range []struct {
		name string
		msgs func(n int) <-chan jetstream.Msg
		n    int // messages the pull brings, of 64 asked for
	}{
		{"all buffered", buffered, 64},
		{"some buffered", buffered, 5},
		{"none", buffered, 0},
		{"one by one", trickling, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds := sub.deliveries(tc.msgs(tc.n), 64)
			if len(ds) != tc.n {
				t.Fatalf("%d deliveries, want %d", len(ds), tc.n)
			}
			for i, d := range ds {
				if d.Handle != msgs[i] || d.Message.ID != "m"+strconv.Itoa(i) || d.BackendID != strconv.Itoa(i+1) || d.Lease != 7*time.Second {
					t.Fatalf("delivery %d: handle %v, ID %q, backend ID %q, lease %s; want message %d", i, d.Handle, d.Message.ID, d.BackendID, d.Lease, i)
				}
				if i > 0 && d == ds[i-1] {
					t.Fatalf("deliveries %d and %d are the same", i-1, i)
				}
			}
		})
	}
	if n := testing.AllocsPerRun(50, func() { sub.deliveries(buffered(64), 64) }); n > 4 {
		t.Errorf("%.0f allocations for a pull of 64 buffered messages, want at most 4", n)
	}
}
