package pubsub

import (
	"strings"
	"testing"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/proto"

	"github.com/dedupq/dedupq/driver"
)

// TestMessageSize checks the computed size against proto.Size of the
// message toMessage builds, which is what the client's bundler counts.
func TestMessageSize(t *testing.T) {
	long := strings.Repeat("v", 200) // a two-byte length prefix
	for _, tc := range []struct {
		name string
		m    driver.Message
	}{
		{"ID only", driver.Message{ID: "a"}},
		{"body", driver.Message{ID: "a", Body: []byte("hello")}},
		{"big body", driver.Message{ID: "a", Body: make([]byte, 20000)}},
		{"ordering key", driver.Message{ID: "a", GroupKey: "k", Body: []byte("b")}},
		{"attributes", driver.Message{ID: "id-1", Attributes: map[string]string{"e": "", "l": long, long: "x", "traceparent": "00-x"}}},
		{"AttrID among attributes", driver.Message{ID: "a", Attributes: map[string]string{AttrID: "other", "k": "v"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gm := toMessage(&tc.m)
			want := proto.Size(&pb.PubsubMessage{Data: gm.Data, Attributes: gm.Attributes, OrderingKey: gm.OrderingKey})
			if got := messageSize(&tc.m); got != want {
				t.Errorf("messageSize = %d, proto.Size = %d", got, want)
			}
		})
	}
}
