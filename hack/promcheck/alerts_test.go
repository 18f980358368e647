package main

import (
	"os"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/promqltest"
)

// ruleExpr returns the one-line expr of the chart's alert name, read from the
// PrometheusRule template (the alerts tested here take no chart values).
func ruleExpr(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../charts/macfleet/templates/monitoring-prometheusrule.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != "- alert: "+name || i+1 == len(lines) {
			continue
		}
		expr, ok := strings.CutPrefix(strings.TrimSpace(lines[i+1]), "expr: ")
		if !ok || expr == "|" || strings.Contains(expr, "{{") {
			t.Fatalf("alert %s: want a one-line expr without chart values after it, got %q", name, lines[i+1])
		}
		return expr
	}
	t.Fatalf("the chart has no alert %s", name)
	return ""
}

// TestRepeatedColdEpochsAlert: MacfleetRepeatedColdEpochs fires for a Mac whose cold
// runner epochs keep being refused a warm-up (replica_rewarmed, mac_rate_limited), not
// for one refused once or twice in the hour, and not for cold epochs that earned no
// warm-up for an ordinary reason (nothing_to_warm; not_enabled: the deployment did not
// opt in, which every cold epoch of such a deployment counts).
func TestRepeatedColdEpochsAlert(t *testing.T) {
	expr := ruleExpr(t, "MacfleetRepeatedColdEpochs")
	const m = "macfleet_gateway_peer_warmups_skipped_total"
	promqltest.RunTest(t, `
load 5m
  `+m+`{node="mac-crashing",reason="replica_rewarmed"} 0+1x12
  `+m+`{node="mac-fishing",reason="replica_rewarmed"} 0 0 0 0 0 0 0 0 0 1 2 2 2
  `+m+`{node="mac-fishing",reason="mac_rate_limited"} 0 0 0 0 0 0 0 0 0 0 1 2 2
  `+m+`{node="mac-restarted",reason="replica_rewarmed"} 0 0 0 0 0 0 1 1 1 1 1 2 2
  `+m+`{node="mac-optedout",reason="not_enabled"} 0+1x12
  `+m+`{node="mac-new",reason="nothing_to_warm"} 0+1x12

eval instant at 60m count by (node) (`+expr+`)
  {node="mac-crashing"} 1
  {node="mac-fishing"} 1
`, promqltest.NewTestEngine(t, false, 0, promqltest.DefaultMaxSamplesPerQuery))
}
