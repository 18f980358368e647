package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// metric is one figure the benchmark compares; streams is the number of concurrent
// streams of a decode figure (0 for the others).
type metric struct {
	key          string
	title        string
	unit         string
	higherBetter bool
	streams      int
}

// metricsFor is the figures of a run with the aggregate decode of each count of
// streams and long long prompts, in the order of the table.
func metricsFor(streams []int, long int) []metric {
	ms := []metric{{"decode1", "decode, 1 stream", "tok/s", true, 1}}
	for _, n := range streams {
		title := fmt.Sprintf("%d concurrent streams, aggregate", n)
		if n == 1 {
			title = "1 stream, aggregate"
		}
		ms = append(ms, metric{streamsJob(n), title, "tok/s", true, n})
	}
	ms = append(ms, metric{"ttftShort", "TTFT, short chat", "ms", false, 0})
	for i := range long {
		ms = append(ms, metric{longJob(i), "TTFT, long prompt", "ms", false, 0})
	}
	return append(ms,
		metric{"cold", "cold start to first token", "ms", false, 0},
		metric{"unload", "unload", "ms", false, 0})
}

// summary is the median and the spread of one metric's samples.
type summary struct {
	n              int
	median, lo, hi float64
}

// summarize returns the median (the mean of the middle two for an even count) and the
// minimum and maximum of xs; n is 0 for no samples.
func summarize(xs []float64) summary {
	if len(xs) == 0 {
		return summary{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return summary{n: len(s), median: m, lo: s[0], hi: s[len(s)-1]}
}

// ratio is macfleet's median over the peer's; 0 when either is missing.
func ratio(ours, theirs summary) float64 {
	if ours.n == 0 || theirs.n == 0 || theirs.median == 0 {
		return 0
	}
	return ours.median / theirs.median
}

// verdict says which side a ratio (macfleet / peer) favours, given the metric's
// direction; within ±2 % it is even (below what these machines' noise lets one claim).
func verdict(r float64, higherBetter bool) string {
	switch {
	case r == 0:
		return "—"
	case r > 0.98 && r < 1.02:
		return "even"
	case (r > 1) == higherBetter:
		return "macfleet"
	default:
		return "peer"
	}
}

// task is one measurement of one subject in a round.
type task struct {
	subject string
	job     string
}

// roundOrder is the order of a round's tasks: a shuffle seeded by the run's seed and
// the round, so a run can be repeated exactly and no subject or job always goes first
// (warming the caches, or the CPU's clock, for the next).
func roundOrder(seed uint64, round int, tasks []task) []task {
	out := slices.Clone(tasks)
	r := rand.New(rand.NewPCG(seed, uint64(round)))
	r.Shuffle(len(out), func(i, k int) { out[i], out[k] = out[k], out[i] })
	return out
}

// cell formats a summary as "median (min–max)" with the unit's precision.
func cell(s summary, unit string) string {
	if s.n == 0 {
		return "—"
	}
	f := func(v float64) string {
		if unit == "ms" && v < 100 {
			return fmt.Sprintf("%.1f", v)
		}
		return fmt.Sprintf("%.0f", v)
	}
	if s.n == 1 {
		return f(s.median)
	}
	return fmt.Sprintf("%s (%s–%s)", f(s.median), f(s.lo), f(s.hi))
}

// ratioCell formats a ratio with the side it favours.
func ratioCell(r float64, higherBetter bool) string {
	if r == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f× (%s)", r, verdict(r, higherBetter))
}

// column is one subject of the table and the subject its ratio is taken against.
type column struct {
	subject string
	title   string
}

// pair is two subjects compared in the table: macfleet's (ours) and the peer's.
type pair struct{ ours, theirs column }

// subjectsOf lists the pairs' subjects once each, in the order they first appear.
func subjectsOf(pairs []pair) []column {
	var out []column
	seen := map[string]bool{}
	for _, p := range pairs {
		for _, c := range []column{p.ours, p.theirs} {
			if !seen[c.subject] {
				seen[c.subject] = true
				out = append(out, c)
			}
		}
	}
	return out
}

// extraColumn is a column after the ratios: its title and each metric's cell.
type extraColumn struct {
	title string
	cell  func(m metric) string
}

// renderTable is the markdown table of the run: one row per metric of ms; for each
// pair the two subjects' medians and spreads (a subject already shown by an earlier pair
// is not repeated) and ours / theirs; then the extra columns. samples maps subject →
// metric key → samples; notes name the metrics' details (such as the long prompt's
// length).
func renderTable(samples map[string]map[string][]float64, pairs []pair, ms []metric, notes map[string]string,
	extra ...extraColumn) string {
	var b strings.Builder
	shown := map[string]bool{}
	var header, rule strings.Builder
	for _, p := range pairs {
		for _, c := range []column{p.ours, p.theirs} {
			if !shown[c.subject] {
				shown[c.subject] = true
				header.WriteString(" | " + c.title)
				rule.WriteString("|---")
			}
		}
		fmt.Fprintf(&header, " | %s / %s", p.ours.title, p.theirs.title)
		rule.WriteString("|---")
	}
	for _, e := range extra {
		header.WriteString(" | " + e.title)
		rule.WriteString("|---")
	}
	fmt.Fprintf(&b, "|%s |\n|---%s|\n", header.String(), rule.String())
	for _, m := range ms {
		dir := "higher is better"
		if !m.higherBetter {
			dir = "lower is better"
		}
		title := m.title
		if n := notes[m.key]; n != "" {
			title += " (" + n + ")"
		}
		fmt.Fprintf(&b, "| %s, %s; %s", title, m.unit, dir)
		clear(shown)
		for _, p := range pairs {
			o, t := summarize(samples[p.ours.subject][m.key]), summarize(samples[p.theirs.subject][m.key])
			for _, c := range []column{p.ours, p.theirs} {
				if !shown[c.subject] {
					shown[c.subject] = true
					fmt.Fprintf(&b, " | %s", cell(summarize(samples[c.subject][m.key]), m.unit))
				}
			}
			fmt.Fprintf(&b, " | %s", ratioCell(ratio(o, t), m.higherBetter))
		}
		for _, e := range extra {
			fmt.Fprintf(&b, " | %s", e.cell(m))
		}
		b.WriteString(" |\n")
	}
	return b.String()
}
