package sqs_test

// Tests of KeepRequestBody: no server, a RoundTripper that reads the body as
// net/http's transport does.

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/dedupq/dedupq/adapters/sqs"
)

// closingBody is a request body as the SDK makes it: once closed, Read
// and WriteTo answer io.EOF.
type closingBody struct {
	mu     sync.Mutex
	r      *strings.Reader
	closed bool
}

func (b *closingBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, io.EOF
	}
	return b.r.Read(p)
}

func (b *closingBody) WriteTo(w io.Writer) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, io.EOF
	}
	return b.r.WriteTo(w)
}

func (b *closingBody) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	return nil
}

// lateReader sends the body, lets the caller close it (the SDK does, once
// the response's headers are in), then makes the transport's last read
// past Content-Length, with io.Copy, and reports that read's error.
type lateReader struct {
	close   func()
	sent    bytes.Buffer
	lastErr error
}

func (l *lateReader) RoundTrip(req *http.Request) (*http.Response, error) {
	if _, err := io.CopyN(&l.sent, req.Body, req.ContentLength); err != nil {
		return nil, err
	}
	l.close()
	_, l.lastErr = io.Copy(io.Discard, req.Body)
	return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
}

func TestKeepRequestBody(t *testing.T) {
	for _, tc := range []struct {
		name    string
		wrap    bool
		wantErr bool
	}{
		{"SDK body as it is", false, true},
		{"KeepRequestBody", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := &closingBody{r: strings.NewReader(`{"QueueUrl":"q"}`)}
			rt := &lateReader{close: func() { body.Close() }}
			var c interface {
				Do(*http.Request) (*http.Response, error)
			} = &http.Client{Transport: rt}
			if tc.wrap {
				c = sqs.KeepRequestBody(&http.Client{Transport: rt})
			}
			req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/", body)
			if err != nil {
				t.Fatal(err)
			}
			req.ContentLength = int64(body.r.Len())
			if _, err := c.Do(req); err != nil {
				t.Fatal(err)
			}
			if rt.sent.String() != `{"QueueUrl":"q"}` {
				t.Fatalf("sent %q", rt.sent.String())
			}
			if (rt.lastErr != nil) != tc.wantErr {
				t.Fatalf("the read after the body was closed: err = %v, want an error: %v", rt.lastErr, tc.wantErr)
			}
		})
	}
}
