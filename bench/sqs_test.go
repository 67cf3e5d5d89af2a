// Checks that an SQS side abandons and makes again a run in which a
// ReceiveMessage attempt failed (a sample fauxqs would stall, see sqsRows),
// and keeps the last of sqsTries runs. Talks to an in-process HTTP server
// that answers SQS's JSON protocol, not to fauxqs.
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

func TestSQSSideRerunsSpoiledRuns(t *testing.T) {
	cases := []struct {
		name     string
		failures int32 // ReceiveMessage requests answered 500 before the first 200
		runs     int
		notes    []string
	}{
		{"no failure", 0, 1, nil},
		{"one failure", 1, 2, []string{"sqs raw round 1: a ReceiveMessage attempt failed (", "made up", "run abandoned and made again"}},
		// Runs 1 and 2 stop at their first failed attempt; run 3 is kept,
		// its SDK retrying its failures 3 and 4.
		{"failures in every run", 4, 3, []string{"run abandoned", "sqs raw round 1: a ReceiveMessage attempt failed in each of 3 runs", "the last run's sample is kept"}},
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
			runs := 0
			s := sqsSide(srv.URL, "raw", func(ctx context.Context, client *awssqs.Client, _ int64) (time.Duration, error) {
				runs++
				_, err := client.ReceiveMessage(ctx, &awssqs.ReceiveMessageInput{QueueUrl: aws.String(srv.URL + "/000000000000/q.fifo")})
				return time.Second, err
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := s.run(ctx, 0, 1); err != nil {
				t.Fatal(err)
			}
			if runs != tc.runs {
				t.Errorf("side ran %d times, want %d", runs, tc.runs)
			}
			notes := strings.Join(takeNotes(), "\n")
			if len(tc.notes) == 0 && notes != "" {
				t.Errorf("notes %q, want none", notes)
			}
			for _, want := range tc.notes {
				if !strings.Contains(notes, want) {
					t.Errorf("notes %q lack %q", notes, want)
				}
			}
		})
	}
}
