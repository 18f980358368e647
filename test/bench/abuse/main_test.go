package main

import (
	"os"
	"testing"
	"time"

	"github.com/macfleet/macfleet/internal/httpserver"
	"github.com/macfleet/macfleet/test/support/localfleet"
)

// TestSmoke runs the harness end to end, cut to a quick check (-smoke): a fleet with
// two gateways, each phase once, the baseline being the binary under test. It checks
// that the harness works and the bounds that hold whatever the machine's load: no
// budget phase serves more than the budget (over two gateways too, as they lease), an
// attacker from one address holds no more than its address's cap (give or take the
// dials in flight: it counts a connection held before it sees the close of the one
// it displaced) and has its connections closed past it, no bearer flood is reviewed
// past the limit, and every legitimate request is answered; not the figures.
func TestSmoke(t *testing.T) {
	dir := t.TempDir()
	bin, runner, err := localfleet.Binaries(dir)
	if err != nil {
		t.Fatal(err)
	}
	o := options{macfleet: bin, runner: runner, choices: 4, maxTokens: 25, budget: 200, redial: time.Second,
		bearerWorkers: 20, timeout: 10 * time.Minute, smoke: true, out: os.Stdout}.smokeSized()
	r, err := run(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, br := range []budgetResult{r.One, r.Two, r.Later} {
		if br.Tokens > o.budget {
			t.Errorf("over %d gateway(s)%s %d tokens were served against a budget of %d a minute",
				br.Gateways, br.laterText(), br.Tokens, o.budget)
		}
		if br.Refused == 0 {
			t.Errorf("over %d gateway(s)%s no stream was refused: %d streams asking %d each cannot all fit %d tokens",
				br.Gateways, br.laterText(), o.streams, br.Ask, o.budget)
		}
	}
	perSource := int64(httpserver.DefaultMaxConnections / httpserver.DefaultSourceShare)
	for _, at := range append(r.Idle.Attacks, r.Serve.Attacks...) {
		if at.Sources == 1 && (at.MaxHeld > perSource+dialers || at.Refused+at.ClosedByGateway == 0) {
			t.Errorf("the attacker (%d %s, refused ones dial again: %s) held at most %d connections, was refused %d and had %d closed, "+
				"want at most %d held and some refused or closed", at.Conns, at.Kind, redialText(at.Redial), at.MaxHeld, at.Refused,
				at.ClosedByGateway, perSource+dialers)
		}
	}
	for _, f := range []bearerResult{r.Random, r.Forged} {
		if f.Reviews > f.Allowed {
			t.Errorf("%d %s bearers: %d TokenReviews, the limit allows %d", f.Sent, f.Kind, f.Reviews, f.Allowed)
		}
	}
}

func TestQuantile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		ds := make([]time.Duration, len(ns))
		for i, n := range ns {
			ds[i] = time.Duration(n) * time.Millisecond
		}
		return ds
	}
	for _, tc := range []struct {
		ds   []time.Duration
		q    float64
		want time.Duration
	}{
		{nil, 0.5, 0},
		{ms(7), 0.99, 7 * time.Millisecond},
		{ms(4, 1, 3, 2), 0.5, 2 * time.Millisecond},
		{ms(5, 1, 4, 2, 3), 0.5, 3 * time.Millisecond},
		{ms(100, 1, 2, 3, 4, 5, 6, 7, 8, 9), 0.99, 100 * time.Millisecond},
		{ms(100, 1, 2, 3, 4, 5, 6, 7, 8, 9), 0.9, 9 * time.Millisecond},
	} {
		if got := quantile(tc.ds, tc.q); got != tc.want {
			t.Errorf("quantile(%v, %v) = %v, want %v", tc.ds, tc.q, got, tc.want)
		}
	}
}
