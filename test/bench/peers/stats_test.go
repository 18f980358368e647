package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want summary
	}{
		{nil, summary{}},
		{[]float64{5}, summary{1, 5, 5, 5}},
		{[]float64{3, 1, 2}, summary{3, 2, 1, 3}},
		{[]float64{4, 1, 3, 2}, summary{4, 2.5, 1, 4}},
		{[]float64{10, 10, 1}, summary{3, 10, 1, 10}},
	} {
		in := slices.Clone(tc.in)
		if got := summarize(tc.in); got != tc.want {
			t.Errorf("summarize(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
		if !slices.Equal(in, tc.in) {
			t.Errorf("summarize reordered its input: %v, was %v", tc.in, in)
		}
	}
}

func TestRatioAndVerdict(t *testing.T) {
	s := func(m float64) summary { return summary{n: 1, median: m, lo: m, hi: m} }
	for _, tc := range []struct {
		ours, theirs summary
		higher       bool
		ratio        float64
		verdict      string
	}{
		{s(120), s(100), true, 1.2, "macfleet"},
		{s(120), s(100), false, 1.2, "peer"},
		{s(80), s(100), false, 0.8, "macfleet"},
		{s(80), s(100), true, 0.8, "peer"},
		{s(101), s(100), true, 1.01, "even"},
		{s(99), s(100), false, 0.99, "even"},
		{summary{}, s(100), true, 0, "—"},
		{s(100), summary{}, true, 0, "—"},
		{s(100), s(0), true, 0, "—"},
	} {
		r := ratio(tc.ours, tc.theirs)
		if diff := r - tc.ratio; diff > 1e-9 || diff < -1e-9 {
			t.Errorf("ratio(%v, %v) = %v, want %v", tc.ours.median, tc.theirs.median, r, tc.ratio)
		}
		if got := verdict(r, tc.higher); got != tc.verdict {
			t.Errorf("verdict(%v, higherBetter=%v) = %q, want %q", r, tc.higher, got, tc.verdict)
		}
	}
}

func TestRoundOrder(t *testing.T) {
	subjects := []string{"macfleet", "peer", "peer-defaults"}
	jobs := []string{"decode1", "streams4", "ttftShort", "ttftLong0", "cold"}
	var tasks []task
	for _, j := range jobs {
		for _, s := range subjects {
			tasks = append(tasks, task{s, j})
		}
	}
	key := func(ts []task) string { return fmt.Sprint(ts) }

	a := roundOrder(7, 0, tasks)
	// Every pair exactly once.
	seen := map[task]int{}
	for _, tk := range a {
		seen[tk]++
	}
	if len(a) != len(subjects)*len(jobs) || len(seen) != len(a) {
		t.Fatalf("round order has %d tasks, %d distinct; want %d of each", len(a), len(seen), len(subjects)*len(jobs))
	}
	for _, s := range subjects {
		for _, j := range jobs {
			if seen[task{s, j}] != 1 {
				t.Errorf("task %s/%s appears %d times", s, j, seen[task{s, j}])
			}
		}
	}
	// The same seed and round give the same order; other rounds and seeds others.
	if key(roundOrder(7, 0, tasks)) != key(a) {
		t.Error("the same seed and round gave two orders")
	}
	if key(tasks) == key(a) || tasks[0] != (task{"macfleet", "decode1"}) {
		t.Error("roundOrder shuffled its input in place, or not at all")
	}
	orders := map[string]bool{key(a): true}
	firsts := map[string]bool{}
	for round := range 8 {
		o := roundOrder(7, round, tasks)
		orders[key(o)] = true
		firsts[o[0].subject] = true
	}
	if len(orders) < 8 {
		t.Errorf("8 rounds of seed 7 gave only %d distinct orders", len(orders))
	}
	if len(firsts) < 2 {
		t.Errorf("the same subject went first in all 8 rounds: %v", firsts)
	}
	if key(roundOrder(8, 0, tasks)) == key(a) {
		t.Error("seeds 7 and 8 gave the same order")
	}
}

func TestRenderTable(t *testing.T) {
	samples := map[string]map[string][]float64{
		"macfleet": {"decode1": {110, 120, 130}, "ttftShort": {30, 40, 50}},
		"peer":     {"decode1": {100, 100, 100}, "ttftShort": {50, 50, 50}},
	}
	ms := metricsFor([]int{4}, 1)
	got := renderTable(samples, []pair{{column{"macfleet", "macfleet"}, column{"peer", "peer, matched"}}}, ms,
		map[string]string{"ttftLong0": "900 tokens"})
	wantLines(t, got,
		"| | macfleet | peer, matched | macfleet / peer, matched |",
		"| decode, 1 stream, tok/s; higher is better | 120 (110–130) | 100 (100–100) | 1.20× (macfleet) |",
		"| TTFT, short chat, ms; lower is better | 40.0 (30.0–50.0) | 50.0 (50.0–50.0) | 0.80× (macfleet) |",
		"| TTFT, long prompt (900 tokens), ms; lower is better | — | — | — |",
	)
	if n := strings.Count(got, "\n"); n != 2+len(ms) {
		t.Errorf("table has %d lines, want %d:\n%s", n, 2+len(ms), got)
	}
}

// TestRenderTablePairs: each subject's cells appear once, at its first pair, and every
// pair has its ratio, so defaults against defaults and matched against the peer's
// defaults sit in one table.
func TestRenderTablePairs(t *testing.T) {
	samples := map[string]map[string][]float64{
		"m":  {"decode1": {120}},
		"p":  {"decode1": {100}},
		"md": {"decode1": {90}},
		"pd": {"decode1": {60}},
	}
	m, p, md, pd := column{"m", "ours"}, column{"p", "theirs"}, column{"md", "ours, defaults"}, column{"pd", "theirs, defaults"}
	got := renderTable(samples, []pair{{m, p}, {md, pd}, {m, pd}}, metricsFor([]int{4}, 1), nil)
	wantLines(t, got,
		"| | ours | theirs | ours / theirs | ours, defaults | theirs, defaults | ours, defaults / theirs, defaults | ours / theirs, defaults |",
		"|---|---|---|---|---|---|---|---|",
		"| decode, 1 stream, tok/s; higher is better | 120 | 100 | 1.20× (macfleet) | 90 | 60 | 1.50× (macfleet) | 2.00× (macfleet) |",
	)
	if got := subjectsOf([]pair{{m, p}, {md, pd}, {m, pd}}); len(got) != 4 || got[3] != pd {
		t.Errorf("subjectsOf = %v, want the four subjects once each", got)
	}
}

// TestMetricsForToday: the default streams and long prompt give the rows, titles and
// directions of the table as it was before they could be chosen.
func TestMetricsForToday(t *testing.T) {
	var got []string
	for _, m := range metricsFor([]int{4}, 1) {
		got = append(got, fmt.Sprintf("%s|%s|%v", m.title, m.unit, m.higherBetter))
	}
	want := []string{
		"decode, 1 stream|tok/s|true",
		"4 concurrent streams, aggregate|tok/s|true",
		"TTFT, short chat|ms|false",
		"TTFT, long prompt|ms|false",
		"cold start to first token|ms|false",
		"unload|ms|false",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("rows (-want +got):\n%s", d)
	}
	var keys []string
	for _, m := range metricsFor([]int{1, 4, 64}, 2) {
		keys = append(keys, fmt.Sprintf("%s/%d", m.key, m.streams))
	}
	want = []string{"decode1/1", "streams1/1", "streams4/4", "streams64/64", "ttftShort/0", "ttftLong0/0", "ttftLong1/0", "cold/0", "unload/0"}
	if d := cmp.Diff(want, keys); d != "" {
		t.Errorf("keys/streams (-want +got):\n%s", d)
	}
}

func TestRenderTableExtraColumn(t *testing.T) {
	samples := map[string]map[string][]float64{"m": {"decode1": {100}, "streams4": {300}}, "p": {"decode1": {50}}}
	shown := []column{{"m", "ours"}, {"p", "theirs"}}
	// 1e9 bytes a step at 1e12 bytes/s: 1000 steps/s is the bound.
	c := &cardInfo{stepBytes: 1e9, tensorBytes: 1.2e9}
	got := renderTable(samples, []pair{{shown[0], shown[1]}}, metricsFor([]int{4}, 1), nil, c.column(samples, shown, 1e12))
	wantLines(t, got,
		"| | ours | theirs | ours / theirs | of HBM bound (ours / theirs) |",
		"|---|---|---|---|---|",
		"| decode, 1 stream, tok/s; higher is better | 100 | 50 | 2.00× (macfleet) | 10 % / 5 % |",
		"| 4 concurrent streams, aggregate, tok/s; higher is better | 300 | — | — | 8 % / — |",
		"| TTFT, short chat, ms; lower is better | — | — | — |  |",
	)
}

// wantLines fails t for each of lines that the table got lacks.
func wantLines(t *testing.T, got string, lines ...string) {
	t.Helper()
	for _, want := range lines {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("table lacks the line\n%s\ngot:\n%s", want, got)
		}
	}
}
