package usagemeter

import (
	"net/http"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/routing"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

// ledgerFunc records what the meter hands the budgets' ledger.
type ledgerFunc func(id tenancy.Identity, deployment string, u metering.Usage)

func (f ledgerFunc) Record(id tenancy.Identity, deployment string, u metering.Usage) {
	f(id, deployment, u)
}

// TestMeter: a readable report within its bound is counted for the caller and in the
// ledger; one over its bound is counted at the bound; an unreadable one counts
// nothing. Each cut or refusal is counted, and only the first is logged at Info.
func TestMeter(t *testing.T) {
	m := Metrics{Usage: metering.NewMeter(),
		Clamped:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "clamped"}, []string{"model", "reason"}),
		Disagreements: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "disagreements"}, []string{"model"})}
	var infos []string
	log := funcr.New(func(_, args string) { infos = append(infos, args) }, funcr.Options{})
	var ledgered []metering.Usage
	meter := New(m, ledgerFunc(func(_ tenancy.Identity, _ string, u metering.Usage) { ledgered = append(ledgered, u) }), log)
	a := Answer{Caller: tenancy.Identity{Namespace: "team-a", Name: "k"}, Model: "team-a/m",
		Backend: routing.Backend{Key: "team-a/m-0", Node: "mac-1", Context: 4096},
		Limits:  metering.Limits{Sequences: 1, MaxTokens: 10, Generates: true}}
	trailer := func(v string) *http.Response {
		return &http.Response{Trailer: http.Header{http.CanonicalHeaderKey(metering.Header): {v}}}
	}

	if u := meter.Trailer(a, trailer("input=12 cached=0 output=5")); u == nil || *u != (metering.Usage{Input: 12, Output: 5}) {
		t.Fatalf("a report within its bound: %v", u)
	}
	if u := meter.Trailer(a, trailer("input=12 cached=0 output=500")); u == nil || u.Output != 10 {
		t.Fatalf("a report over max_tokens: %v, want output counted at 10", u)
	}
	if u := meter.Trailer(a, trailer("input=-1")); u != nil {
		t.Fatalf("an unreadable report: %v, want nothing counted", u)
	}
	if u := meter.Trailer(a, &http.Response{}); u != nil {
		t.Fatalf("no report: %v", u)
	}
	if got := testutil.ToFloat64(m.Usage.Tokens.WithLabelValues("team-a", "k", "team-a/m", metering.TypeOutput)); got != 15 {
		t.Errorf("output tokens counted %v, want 15", got)
	}
	if len(ledgered) != 2 {
		t.Errorf("the ledger got %v, want the two readable reports", ledgered)
	}
	if got := testutil.ToFloat64(m.Clamped.WithLabelValues("team-a/m", metering.ClampUnreadable)); got != 1 {
		t.Errorf("unreadable reports counted %v, want 1", got)
	}
	if len(infos) != 1 || !strings.Contains(infos[0], "further ones are counted") {
		t.Errorf("logged at Info %q, want the first distrusted report only", infos)
	}
}
