// Package prometheus_test checks the Prometheus rules beside it with the
// real promtool (Debian's prometheus package): `promtool check rules`, then
// `promtool test rules` on dedupq.rules_test.yml, and that every rule has
// a test there. It talks to no service. Without promtool it skips, and
// fails under CI=true, where .ci/run installs it.
package prometheus_test

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"testing"
	"time"
)

const (
	rulesFile = "dedupq.rules.yml"
	testsFile = "dedupq.rules_test.yml"
)

func promtool(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("promtool")
	switch {
	case err == nil:
		return path
	case os.Getenv("CI") != "":
		t.Fatalf("promtool is not installed under CI (apt-get install prometheus): %v", err)
	default:
		t.Skipf("promtool is not installed (apt-get install prometheus): %v; skipping outside CI", err)
	}
	return ""
}

func TestRules(t *testing.T) {
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", rulesFile},
		{"test", "rules", testsFile},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

// TestEveryRuleIsTested keeps dedupq.rules_test.yml complete: an alerting
// rule needs an alert_rule_test, a recording rule a promql_expr_test of
// its name.
func TestEveryRuleIsTested(t *testing.T) {
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(testsFile)
	if err != nil {
		t.Fatal(err)
	}
	names := func(re string, text []byte) []string {
		var out []string
		for _, m := range regexp.MustCompile(re).FindAllSubmatch(text, -1) {
			out = append(out, string(m[1]))
		}
		return out
	}
	alerts := names(`(?m)^\s*- alert: (\S+)$`, rules)
	records := names(`(?m)^\s*- record: (\S+)$`, rules)
	if len(alerts) == 0 || len(records) == 0 {
		t.Fatalf("found %d alerts and %d recording rules in %s", len(alerts), len(records), rulesFile)
	}
	tested := names(`(?m)^\s*alertname: (\S+)$`, tests)
	exprs := names(`(?m)^\s*- expr: (\S+)$`, tests)
	for _, a := range alerts {
		if !slices.Contains(tested, a) {
			t.Errorf("alert %s has no alert_rule_test in %s", a, testsFile)
		}
	}
	for _, r := range records {
		if !slices.Contains(exprs, r) {
			t.Errorf("recording rule %s has no promql_expr_test in %s", r, testsFile)
		}
	}
}
