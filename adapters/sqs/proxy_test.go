package sqs_test

// faultProxy sits between the SQS client and fauxqs to inject the failures
// fauxqs never produces by itself (server errors, retryable batch entries).
// It talks only to the emulator on loopback.

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// intercept decides what the proxy does with the nth request (from 1) of
// an action: answer it itself (status and body), or forward body (possibly
// rewritten) and pass the response through rewrite (nil: unchanged).
type intercept func(action string, n int, body []byte) (status int, answer []byte, forward []byte, rewrite func([]byte) []byte)

type faultProxy struct {
	srv    *httptest.Server
	target string
	fault  intercept

	mu       sync.Mutex
	requests map[string][][]byte // action → request bodies as sent by the client
}

func newFaultProxy(t *testing.T, target string, fault intercept) *faultProxy {
	p := &faultProxy{target: target, fault: fault, requests: map[string][][]byte{}}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *faultProxy) URL() string { return p.srv.URL }

// Requests returns the bodies of the requests made for action.
func (p *faultProxy) Requests(action string) [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]byte(nil), p.requests[action]...)
}

func (p *faultProxy) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	action := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "AmazonSQS.")
	p.mu.Lock()
	p.requests[action] = append(p.requests[action], body)
	n := len(p.requests[action])
	p.mu.Unlock()

	forward, rewrite := body, func(b []byte) []byte { return b }
	if p.fault != nil {
		status, answer, fwd, rw := p.fault(action, n, body)
		if status != 0 {
			w.Header().Set("Content-Type", "application/x-amz-json-1.0")
			w.WriteHeader(status)
			w.Write(answer)
			return
		}
		if fwd != nil {
			forward = fwd
		}
		if rw != nil {
			rewrite = rw
		}
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, p.target+r.URL.RequestURI(), bytes.NewReader(forward))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	for _, h := range []string{"Content-Type", "X-Amz-Target", "X-Amz-Query-Mode", "Authorization", "X-Amz-Date"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out = rewrite(out)
	for _, h := range []string{"Content-Type", "X-Amzn-Query-Error", "X-Amzn-Requestid"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(out)
}

// serverError is SQS's answer to a request it failed on its side.
var serverError = []byte(`{"__type":"com.amazonaws.sqs#InternalError","message":"injected by the test proxy"}`)

// batchRequest is the part of a SendMessageBatch request the tests read.
type batchRequest struct {
	QueueUrl string
	Entries  []map[string]any
}

func parseBatch(t *testing.T, body []byte) batchRequest {
	t.Helper()
	var b batchRequest
	if err := json.Unmarshal(body, &b); err != nil {
		t.Errorf("SendMessageBatch request is not JSON: %v", err)
	}
	return b
}

// dedupIDs lists the MessageDeduplicationIds of a SendMessageBatch request.
func dedupIDs(t *testing.T, body []byte) []string {
	var ids []string
	for _, e := range parseBatch(t, body).Entries {
		id, _ := e["MessageDeduplicationId"].(string)
		ids = append(ids, id)
	}
	return ids
}
