package sqs

// Unit tests of the adapter's pure parts: ID mapping, body and attribute
// encoding, attribute-name rules, queue attribute parsing, error
// classification. They talk to nothing.

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/dedupq/dedupq/driver"
)

func TestValidID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"order-1", true},
		{strings.Repeat("a", 128), true},
		{strings.Repeat("a", 129), false},
		{"", false},
		{`!"#$%&'()*+,-./:;<=>?@[\]^_` + "`{|}~", true},
		{"a b", false},
		{"é", false},
		{"a\x00", false},
	} {
		if got := validID(tc.id); got != tc.want {
			t.Errorf("validID(%q) = %v, want %v", tc.id, got, tc.want)
		}
	}
}

func TestWireID(t *testing.T) {
	long := strings.Repeat("x", 129)
	for _, tc := range []struct {
		id       string
		hashLong bool
		want     string
		hashed   bool
	}{
		{"order-1", false, "order-1", false},
		{"order-1", true, "order-1", false},
		{long, false, long, false}, // refused earlier by the portable check
		{long, true, HashID(long), true},
		{"a b", true, HashID("a b"), true},
		{"sha256:" + strings.Repeat("0", 64), true, HashID("sha256:" + strings.Repeat("0", 64)), true},
	} {
		got, hashed := wireID(tc.id, tc.hashLong)
		if got != tc.want || hashed != tc.hashed {
			t.Errorf("wireID(%.20q, %v) = %q, %v; want %q, %v", tc.id, tc.hashLong, got, hashed, tc.want, tc.hashed)
		}
		if !validID(got) && tc.hashLong {
			t.Errorf("wireID(%.20q) = %q is not a valid SQS ID", tc.id, got)
		}
	}
	if h := HashID("x"); len(h) != 71 || h != HashID("x") || h == HashID("y") {
		t.Errorf("HashID is not a fixed-length deterministic digest: %q", h)
	}
}

func TestBodyEncoding(t *testing.T) {
	for _, tc := range []struct {
		name string
		body []byte
		enc  string
	}{
		{"text", []byte("hello, wörld\t\n"), ""},
		{"emoji", []byte("🙂"), ""},
		{"empty", nil, "empty"},
		{"nul", []byte("a\x00b"), "base64"},
		{"invalid utf-8", []byte{0xff, 0xfe}, "base64"},
		{"control", []byte("\x01"), "base64"},
		{"U+FFFE", []byte("\uFFFE"), "base64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wire, enc := encodeBody(tc.body)
			if enc != tc.enc {
				t.Errorf("encoding %q, want %q", enc, tc.enc)
			}
			if !validText(wire) || wire == "" {
				t.Errorf("wire body %q is not SQS text", wire)
			}
			if got := decodeBody(wire, enc); !bytes.Equal(got, tc.body) {
				t.Errorf("round trip %q, want %q", got, tc.body)
			}
		})
	}
	if got := decodeBody("not base64!", "base64"); string(got) != "not base64!" {
		t.Errorf("broken base64 decoded to %q", got)
	}
}

// TestMeasure checks that Limits.Check's size-only path (measure) finds
// the size of the entry SendBatch builds, counted from that entry, and
// refuses a message just over the limit.
func TestMeasure(t *testing.T) {
	top := &Topic{opts: Options{HashLongIDs: true, DefaultGroup: "g"}}
	long := strings.Repeat("x", 200)
	for _, tc := range []struct {
		name string
		m    driver.Message
	}{
		{"text", driver.Message{ID: "a", Body: []byte("hello")}},
		{"U+FFFD is text", driver.Message{ID: "a", Body: []byte("\uFFFD")}},
		{"empty body", driver.Message{ID: "a"}},
		{"binary body", driver.Message{ID: "a", Body: []byte{0, 0xff, 1}}},
		{"attributes", driver.Message{ID: "a", GroupKey: "k", Body: []byte("b"), Attributes: map[string]string{"s": "v", "e": "", "bin": "\x00\xff"}}},
		{"hashed ID", driver.Message{ID: long, Body: []byte("b")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := top.measure(&tc.m, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			e, size, err := top.entry(3, &tc.m, 1<<20, make([]string, entryStrings))
			if err != nil {
				t.Fatal(err)
			}
			want := len(*e.MessageBody)
			for k, a := range e.MessageAttributes {
				want += attrWireSize(k, a)
			}
			if w.size != want || size != want {
				t.Errorf("measured %d, entry reports %d, the entry counts %d", w.size, size, want)
			}
			if *e.Id != "3" || *e.MessageGroupId != w.group || *e.MessageDeduplicationId != w.id {
				t.Errorf("entry Id %q group %q dedup ID %q", *e.Id, *e.MessageGroupId, *e.MessageDeduplicationId)
			}
			if len(tc.m.Attributes) == 0 && w.enc == "" && !w.hashed && e.MessageAttributes != nil {
				t.Errorf("attributes %v, want none", e.MessageAttributes)
			}
			if _, err := top.measure(&tc.m, want-1); !errors.Is(err, ErrTooLarge) {
				t.Errorf("one byte over: %v, want ErrTooLarge", err)
			}
		})
	}
}

// attrWireSize is what an attribute counts toward SQS's message size: its
// name, data type and value. Binary values are counted as their base64
// text, which is what goes over the wire and what some emulators count;
// AWS counts the raw bytes, so this errs on the safe side.
func attrWireSize(name string, a types.MessageAttributeValue) int {
	n := len(name) + len(aws.ToString(a.DataType)) + len(aws.ToString(a.StringValue))
	if a.BinaryValue != nil {
		n += base64.StdEncoding.EncodedLen(len(a.BinaryValue))
	}
	return n
}

func TestAttrEncoding(t *testing.T) {
	for _, v := range []string{"v", "", "\x00\xff", "ü", strings.Repeat("z", 300)} {
		a := encodeAttr(v)
		if got := decodeAttr(a); got != v {
			t.Errorf("attribute %q came back as %q (type %s)", v, got, *a.DataType)
		}
	}
	str := "12"
	num := "Number"
	if got := decodeAttr(types.MessageAttributeValue{DataType: &num, StringValue: &str}); got != "12" {
		t.Errorf("Number attribute read as %q", got)
	}
}

func TestValidAttrName(t *testing.T) {
	for _, tc := range []struct {
		name string
		want bool
	}{
		{"trace-id", true},
		{"a.b_c-D9", true},
		{"", false},
		{".a", false},
		{"a.", false},
		{"a..b", false},
		{"AWS.x", false},
		{"amazon.x", false},
		{"dedupq-id", false},
		{"a b", false},
		{strings.Repeat("a", 257), false},
	} {
		if got := validAttrName(tc.name); got != tc.want {
			t.Errorf("validAttrName(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestParseQueueInfo(t *testing.T) {
	for _, tc := range []struct {
		name    string
		attrs   map[string]string
		want    QueueInfo
		wantErr string
	}{
		{
			name:  "fifo defaults",
			attrs: map[string]string{"FifoQueue": "true", "MaximumMessageSize": "262144", "VisibilityTimeout": "30"},
			want:  QueueInfo{FIFO: true, DeduplicationScope: "queue", MaxMessageBytes: 262144, VisibilityTimeout: 30 * time.Second},
		},
		{
			name: "high throughput, redrive with string count",
			attrs: map[string]string{"FifoQueue": "true", "DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId",
				"ContentBasedDeduplication": "true", "RedrivePolicy": `{"deadLetterTargetArn":"arn:dlq","maxReceiveCount":"7"}`},
			want: QueueInfo{FIFO: true, ContentBasedDeduplication: true, DeduplicationScope: "messageGroup", FifoThroughputLimit: "perMessageGroupId",
				MaxMessageBytes: defaultMaxMessageBytes, MaxReceiveCount: 7, DeadLetterTargetARN: "arn:dlq"},
		},
		{name: "standard queue", attrs: map[string]string{"VisibilityTimeout": "30"}, wantErr: "not a FIFO queue"},
		{name: "bad size", attrs: map[string]string{"FifoQueue": "true", "MaximumMessageSize": "big"}, wantErr: "MaximumMessageSize"},
		{name: "bad redrive", attrs: map[string]string{"FifoQueue": "true", "RedrivePolicy": "{"}, wantErr: "RedrivePolicy"},
		{name: "redrive without count", attrs: map[string]string{"FifoQueue": "true", "RedrivePolicy": `{"deadLetterTargetArn":"x"}`}, wantErr: "maxReceiveCount"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseQueueInfo("", tc.attrs)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestVisibilitySeconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int32
	}{
		{-time.Second, 0}, {0, 0}, {time.Millisecond, 1}, {time.Second, 1},
		{1500 * time.Millisecond, 2}, {13 * time.Hour, 43200},
	} {
		if got := visibilitySeconds(tc.d); got != tc.want {
			t.Errorf("visibilitySeconds(%s) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

func TestIsRetryable(t *testing.T) {
	httpErr := func(code int, err error) error {
		return &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: code}}, Err: err}
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"deadline", fmt.Errorf("op: %w", context.DeadlineExceeded), true},
		{"transport", &net.OpError{Op: "dial", Err: errors.New("refused")}, true},
		{"refused before sending", &refused{ErrTooLarge}, false},
		{"closed", fmt.Errorf("x: %w", ErrClosed), false},
		{"sender-fault entry", &EntryError{Code: "InvalidParameterValue", SenderFault: true}, false},
		{"throttled entry", &EntryError{Code: "RequestThrottled", SenderFault: true}, true},
		{"service-fault entry", &EntryError{Code: "InternalError"}, true},
		{"modelled client fault", &types.QueueDoesNotExist{}, false},
		{"throttling", &smithy.GenericAPIError{Code: "RequestThrottled", Fault: smithy.FaultClient}, true},
		{"server fault", &smithy.GenericAPIError{Code: "InternalError", Fault: smithy.FaultServer}, true},
		{"unmodelled 400", httpErr(400, &smithy.GenericAPIError{Code: "InvalidParameterValue"}), false},
		{"unmodelled 500", httpErr(500, &smithy.GenericAPIError{Code: "InternalError"}), true},
		{"unmodelled 429", httpErr(429, &smithy.GenericAPIError{Code: "Whatever"}), true},
	} {
		if got := isRetryable(tc.err); got != tc.want {
			t.Errorf("%s: isRetryable(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

func TestLimits(t *testing.T) {
	q := QueueInfo{MaxMessageBytes: 1000}
	for _, tc := range []struct {
		name          string
		o             Options
		idLen, attrs  int
		groupRequired bool
	}{
		{"strict", Options{}, 128, 9, true},
		{"default group", Options{DefaultGroup: "g"}, 128, 9, false},
		{"hashing", Options{HashLongIDs: true}, 0, 8, true},
	} {
		l := limits(tc.o, q)
		if l.MaxIDLength != tc.idLen || l.MaxAttributes != tc.attrs || l.GroupKeyRequired != tc.groupRequired ||
			l.MaxMessageBytes != 1000 || l.GroupKeyAllowed == nil || l.MaxGroupKeyLength != 128 {
			t.Errorf("%s: limits %+v", tc.name, l)
		}
		if (l.IDAllowed == nil) != tc.o.HashLongIDs {
			t.Errorf("%s: IDAllowed set %v with HashLongIDs %v", tc.name, l.IDAllowed != nil, tc.o.HashLongIDs)
		}
	}
}
