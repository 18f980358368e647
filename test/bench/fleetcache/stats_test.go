package main

import (
	"strings"
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 5}, {90, 9}, {99, 10}, {100, 10}, {1, 1}, {0, 1}} {
		if got := percentile(ds, tc.p); got != tc.want {
			t.Errorf("p%v = %d, want %d", tc.p, got, tc.want)
		}
	}
	if percentile(nil, 90) != 0 {
		t.Error("the percentile of nothing is not 0")
	}
	if ds[0] != 5 {
		t.Error("percentile sorted its argument")
	}
}

func TestSummarize(t *testing.T) {
	s := time.Second
	outs := []outcome{
		{Start: 0, End: 2 * s, TTFT: 1 * s, Prompt: 100, Cached: 0, Completion: 4},
		{Start: 1 * s, End: 3 * s, TTFT: 100 * time.Millisecond, Prompt: 100, Cached: 90, Completion: 4},
		{Start: 2 * s, End: 4 * s, TTFT: 3 * s, Prompt: 100, Cached: 0, Completion: 4},
		{Start: 3 * s, End: 9 * s, Err: "timeout"},
	}
	got := summarize("prefix-cache", outs, tierCounters{HotHits: 1}, map[string]float64{"prefix_hit": 1})
	if got.Requests != 4 || got.Failed != 1 {
		t.Errorf("%d requests, %d failed", got.Requests, got.Failed)
	}
	if got.P50 != s || got.P90 != 3*s || got.ColdTTFT != s {
		t.Errorf("p50 %s, p90 %s, cold %s", got.P50, got.P90, got.ColdTTFT)
	}
	// Three answers from 0 to 4 s: 0.75 req/s, 300 prompt tokens, 12 generated.
	if got.ReqPerSec != 0.75 || got.PromptTokSec != 75 || got.GenTokSec != 3 {
		t.Errorf("%v req/s, %v prompt tok/s, %v generated tok/s", got.ReqPerSec, got.PromptTokSec, got.GenTokSec)
	}
	if got.HitRate() != 0.3 {
		t.Errorf("hit rate %v, want 0.3", got.HitRate())
	}
	row := table([]summary{got})
	for _, want := range []string{"`prefix-cache`", "| 4 (1) |", "90 of 300 (30.0 %)", "prefix_hit 1"} {
		if !strings.Contains(row, want) {
			t.Errorf("the table lacks %q:\n%s", want, row)
		}
	}
	if ratio(3*s, s) != 3 || ratio(s, 0) != 0 {
		t.Error("ratio")
	}
}

func TestCountersDelta(t *testing.T) {
	a := tierCounters{10, 20, 30, 40, 50, 60, 70, 80}
	b := tierCounters{1, 2, 3, 4, 5, 6, 7, 8}
	if got := a.sub(b).add(b); got != a {
		t.Errorf("%+v", got)
	}
}
