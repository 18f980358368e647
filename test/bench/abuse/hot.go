package main

import (
	"context"
	"fmt"
	"time"

	"github.com/macfleet/macfleet/test/support/localfleet"
)

// hotResult is the hot path phase: one-token chat completions through the gateway
// under test and through the baseline's, interleaved.
type hotResult struct {
	Pairs          int
	Test, Baseline latencies
}

// delta is the gateway under test's p50 minus the baseline's.
func (h hotResult) delta() time.Duration { return h.Test.quantile(0.5) - h.Baseline.quantile(0.5) }

// hotPhase starts a gateway of the baseline binary beside the fleet's and sends
// o.pairs pairs of one-token requests of the hot key (budgeted, never refused) from
// 127.0.0.5 on kept-alive connections, alternating which goes first, after 10 pairs
// of warm-up.
func hotPhase(ctx context.Context, o options, fl *benchFleet, baseline string) (hotResult, error) {
	r := hotResult{Pairs: o.pairs}
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	baseURL, err := fl.f.AddGateway(startCtx, baseline)
	if err != nil {
		return r, fmt.Errorf("starting the baseline's gateway (%s): %w", baseline, err)
	}
	if err := fl.waitServes(startCtx, baseURL); err != nil {
		return r, err
	}
	fmt.Fprintf(o.out, "hot path: %d pairs through the gateway under test and the baseline's; load %s\n", o.pairs, localfleet.LoadAverage())
	c := from("127.0.0.5", true, 2)
	key := fl.keys[keyHot]
	urls := [2]string{fl.urls[0], baseURL}
	for i := range o.pairs + 10 {
		var got [2]latencies
		for j := range 2 {
			k := (i + j) % 2 // the first of each pair alternates
			got[k].add(timed(ctx, c, urls[k], key))
		}
		if i >= 10 {
			r.Test.merge(got[0])
			r.Baseline.merge(got[1])
		}
	}
	fmt.Fprintf(o.out, "hot path: p50 %s under test, %s baseline (%+.0f µs, %.2f×)\n", ms(r.Test.quantile(0.5)),
		ms(r.Baseline.quantile(0.5)), float64(r.delta())/float64(time.Microsecond), ratio(r.Test.quantile(0.5), r.Baseline.quantile(0.5)))
	return r, nil
}

func (l *latencies) merge(m latencies) {
	l.D = append(l.D, m.D...)
	l.Failed += m.Failed
	if m.LastFail != "" {
		l.LastFail = m.LastFail
	}
}
