package main

// Runs the program in-process, on the embedded JetStream server (no
// services), serving its metrics on a loopback port, and reads them as a
// scrape does. Then it starts a real Prometheus server (Debian's prometheus
// package) on loopback, with a port and a data directory of its own,
// scraping the program every second and evaluating the shipped rules
// (deploy/prometheus/dedupq.rules.yml), and checks through Prometheus's
// HTTP API the scraped values, the recording rules' results, and that the
// alert DedupqDeliveriesTerminated fires for the order the handler
// refused. The server is stopped by its PID. Without the prometheus binary
// that part skips, and fails under CI=true, where .ci/run installs it.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dedupq/dedupq/adapters/jetstream/embedded"
	"github.com/dedupq/dedupq/window"
)

func TestScrapedByPrometheus(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a, err := start(t.Context(), ln)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.close()
		if err := embedded.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	var out strings.Builder
	if err := a.work(t.Context(), &out); err != nil {
		t.Fatalf("work: %v\n%s", err, out.String())
	}
	if got, want := strings.TrimSpace(out.String()), "stored=4 broker_duplicates=1 acked=3 terminated=1"; got != want {
		t.Fatalf("summary %q, want %q", got, want)
	}
	target := ln.Addr().String()
	body := get(t, "http://"+target+"/metrics")
	for _, want := range []string{
		`dedupq_consume_deliveries_total{dedupq_outcome="terminate",messaging_destination_name="ORDERS",messaging_destination_subscription_name="worker",messaging_system="jetstream"`,
		`dedupq_publish_messages_total{dedupq_outcome="broker_duplicate",messaging_destination_name="ORDERS",messaging_system="jetstream"`,
		`dedupq_dedup_headroom_seconds{dedupq_role="consumer"`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}

	prom := startPrometheus(t, target)
	// The consumer's worst case is its redelivery span: the publishers'
	// retries fit the stream's window.
	headroom := (window.UsableTTL(a.guard.TTL(), 0) - a.con.Redelivery().Span()).Seconds()
	for _, q := range []struct {
		query string
		want  float64
	}{
		{`dedupq_consume_deliveries_total{dedupq_outcome="ack"}`, 3},
		{`dedupq_consume_deliveries_total{dedupq_outcome="terminate"}`, 1},
		{`dedupq_publish_messages_total{dedupq_outcome="stored"}`, 4},
		{`dedupq_publish_messages_total{dedupq_outcome="broker_duplicate"}`, 1},
		{`dedupq_dedup_decisions_total{dedupq_outcome="ran"}`, 3},
		{`dedupq_dedup_decisions_total{dedupq_outcome="failed"}`, 1},
		{`dedupq_window_seconds{dedupq_role="publisher"}`, 120},
		{`dedupq_dedup_headroom_seconds`, headroom},
		{`dedupq:dedup_headroom:ratio`, headroom / a.guard.TTL().Seconds()},
	} {
		prom.waitFor(t, q.query, func() (bool, string) {
			v, ok := prom.value(t, q.query)
			return ok && v == q.want, fmt.Sprintf("%s = %v (present %v), want %v", q.query, v, ok, q.want)
		})
	}
	prom.waitFor(t, "the alert", func() (bool, string) {
		alerts := prom.alerts(t)
		for _, al := range alerts {
			if al.Labels["alertname"] == "DedupqDeliveriesTerminated" && al.State == "firing" &&
				al.Labels["messaging_system"] == "jetstream" && al.Labels["messaging_destination_name"] == "ORDERS" &&
				al.Labels["severity"] == "warning" && al.Labels["job"] == "dedupq-example" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("no firing DedupqDeliveriesTerminated for jetstream ORDERS in %+v", alerts)
	})
	// Every rule evaluated on the real series without an error.
	for _, r := range prom.rules(t) {
		if r.Health != "ok" {
			t.Errorf("rule %s: health %q, error %q", r.Name, r.Health, r.LastError)
		}
	}
}

// promServer is a Prometheus server of the test's own.
type promServer struct {
	base string // http://127.0.0.1:port
	log  *bytes.Buffer
}

// startPrometheus runs prometheus on a free loopback port with a data
// directory under t.TempDir(), scraping target every second and
// evaluating the shipped rules every second, and stops it by its PID when
// the test ends.
func startPrometheus(t *testing.T, target string) *promServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	switch {
	case err != nil && os.Getenv("CI") != "":
		t.Fatalf("prometheus is not installed under CI (apt-get install prometheus): %v", err)
	case err != nil:
		t.Skipf("prometheus is not installed (apt-get install prometheus): %v; skipping outside CI", err)
	}
	rules, err := filepath.Abs("../../deploy/prometheus/dedupq.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: dedupq-example
    static_configs:
      - targets: [%q]
`, rules, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	// A free port can be taken between its lookup and the server's bind:
	// a server that exits at once is started again on another.
	for try := 1; ; try++ {
		port := freePort(t)
		p := &promServer{base: "http://127.0.0.1:" + port, log: &bytes.Buffer{}}
		cmd := exec.Command(bin,
			"--config.file="+cfgPath,
			"--storage.tsdb.path="+filepath.Join(dir, "data"),
			"--web.listen-address=127.0.0.1:"+port,
		)
		cmd.Stdout, cmd.Stderr = p.log, p.log
		dieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		if p.ready(exited) {
			t.Cleanup(func() {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(30 * time.Second):
					_ = cmd.Process.Kill()
					<-exited
				}
				if t.Failed() {
					t.Logf("prometheus log:\n%s", p.log)
				}
			})
			return p
		}
		select {
		case err := <-exited:
			if try < 3 {
				continue
			}
			t.Fatalf("prometheus exited: %v\n%s", err, p.log)
		default:
			_ = cmd.Process.Kill()
			<-exited
			t.Fatalf("prometheus not ready within a minute\n%s", p.log)
		}
	}
}

// ready polls /-/ready until it answers 200, the server exits, or a
// minute passes.
func (p *promServer) ready(exited <-chan error) bool {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if len(exited) > 0 {
			return false
		}
		resp, err := http.Get(p.base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// waitFor polls cond until it holds, failing the test with cond's last
// word after two minutes: time for a few scrapes and rule evaluations on
// a loaded machine.
func (p *promServer) waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s", what, why)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// api GETs path from the server's HTTP API into data.
func (p *promServer) api(t *testing.T, path string, data any) {
	t.Helper()
	var resp struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal([]byte(get(t, p.base+path)), &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Status != "success" {
		t.Fatalf("GET %s: %s: %s", path, resp.Status, resp.Error)
	}
	if err := json.Unmarshal(resp.Data, data); err != nil {
		t.Fatal(err)
	}
}

// value is the instant query's only result.
func (p *promServer) value(t *testing.T, query string) (float64, bool) {
	t.Helper()
	var data struct {
		Result []struct {
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	p.api(t, "/api/v1/query?query="+url.QueryEscape(query), &data)
	if len(data.Result) != 1 {
		return 0, false
	}
	s, _ := data.Result[0].Value[1].(string)
	v, err := strconv.ParseFloat(s, 64)
	return v, err == nil
}

type alert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

func (p *promServer) alerts(t *testing.T) []alert {
	t.Helper()
	var data struct {
		Alerts []alert `json:"alerts"`
	}
	p.api(t, "/api/v1/alerts", &data)
	return data.Alerts
}

type rule struct {
	Name      string `json:"name"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
}

// rules are the loaded rules, once each has been evaluated.
func (p *promServer) rules(t *testing.T) []rule {
	t.Helper()
	var all []rule
	p.waitFor(t, "the rules' evaluation", func() (bool, string) {
		var data struct {
			Groups []struct {
				Rules []rule `json:"rules"`
			} `json:"groups"`
		}
		p.api(t, "/api/v1/rules", &data)
		all = all[:0]
		for _, g := range data.Groups {
			all = append(all, g.Rules...)
		}
		for _, r := range all {
			if r.Health == "unknown" {
				return false, "rule " + r.Name + " not evaluated yet"
			}
		}
		return len(all) > 0, "no rules loaded"
	})
	return all
}

func get(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", u, resp.Status, b)
	}
	return string(b)
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}
