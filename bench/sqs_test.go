// Checks that an SQS side counts the ReceiveMessage calls the SDK retried
// (the samples fauxqs spoils, see sqsRows). Talks to an in-process HTTP
// server that answers SQS's JSON protocol, not to fauxqs.
package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
)

func TestSQSSideNotesRetriedReceives(t *testing.T) {
	cases := []struct {
		name     string
		failures int32 // ReceiveMessage requests answered 500 before the first 200
		retried  int
	}{
		{"no retry", 0, 0},
		{"one retry", 1, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var failed atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/x-amz-json-1.0")
				if strings.HasSuffix(r.Header.Get("X-Amz-Target"), ".ReceiveMessage") && failed.Add(1) <= tc.failures {
					w.WriteHeader(http.StatusInternalServerError)
					_, _ = io.WriteString(w, `{"__type":"com.amazonaws.sqs#InternalError","message":"made up"}`)
					return
				}
				_, _ = io.WriteString(w, `{}`)
			}))
			defer srv.Close()
			takeNotes()
			s := sqsSide(srv.URL, "raw", func(ctx context.Context, client *awssqs.Client, _ int64) (time.Duration, error) {
				_, err := client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: aws.String(srv.URL + "/000000000000/q.fifo")})
				return time.Second, err
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := s.run(ctx, 0, 1); err != nil {
				t.Fatal(err)
			}
			notes := takeNotes()
			if tc.retried == 0 {
				if len(notes) != 0 {
					t.Fatalf("notes %q, want none", notes)
				}
				return
			}
			if len(notes) != 1 || !strings.Contains(notes[0], "sqs raw round 1: the SDK retried 1 ReceiveMessage call(s)") || !strings.Contains(notes[0], "made up") {
				t.Fatalf("notes %q, want one naming the retry and its error", notes)
			}
		})
	}
}
