package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// outcome is one request's measurement.
type outcome struct {
	Tenant, User int
	// Start and End are offsets from the mode's start; TTFT from sending to the first
	// streamed chunk.
	Start, End, TTFT time.Duration
	// Prompt, Cached and Completion are the answer's usage.
	Prompt, Cached, Completion int
	Err                        string
}

// tierCounters are an agent's prompt cache counters summed over its runners.
// InflightShares and InflightSharedTokens are the restores (and their tokens) taken
// from another slot prefilling the prefix, not from a tier.
type tierCounters struct {
	HotHits, HotMisses, SSDHits, SSDMisses, Restores, RestoredTokens int64
	InflightShares, InflightSharedTokens                             int64
}

func (a tierCounters) sub(b tierCounters) tierCounters {
	return a.add(b.times(-1))
}

func (a tierCounters) times(k int64) tierCounters {
	return tierCounters{k * a.HotHits, k * a.HotMisses, k * a.SSDHits, k * a.SSDMisses, k * a.Restores, k * a.RestoredTokens,
		k * a.InflightShares, k * a.InflightSharedTokens}
}

func (a tierCounters) add(b tierCounters) tierCounters {
	return tierCounters{a.HotHits + b.HotHits, a.HotMisses + b.HotMisses, a.SSDHits + b.SSDHits,
		a.SSDMisses + b.SSDMisses, a.Restores + b.Restores, a.RestoredTokens + b.RestoredTokens,
		a.InflightShares + b.InflightShares, a.InflightSharedTokens + b.InflightSharedTokens}
}

// summary is one routing mode's row of the results.
type summary struct {
	Mode                    string
	Requests, Failed        int
	P50, P90, P99           time.Duration
	ColdTTFT                time.Duration // median TTFT of the answers that restored nothing
	ReqPerSec, PromptTokSec float64
	GenTokSec               float64
	Prompt, Cached          int
	Tiers                   tierCounters
	// Routed counts the gateway's routing decisions by kind.
	Routed map[string]float64
}

// HitRate is the share of the prompt tokens restored instead of prefilled.
func (s summary) HitRate() float64 {
	if s.Prompt == 0 {
		return 0
	}
	return float64(s.Cached) / float64(s.Prompt)
}

// summarize computes a mode's row from its outcomes and the agents' counters' delta.
func summarize(mode string, outs []outcome, tiers tierCounters, routed map[string]float64) summary {
	s := summary{Mode: mode, Tiers: tiers, Routed: routed}
	var ttfts, cold []time.Duration
	var first, last time.Duration = math.MaxInt64, 0
	gen := 0
	for _, o := range outs {
		s.Requests++
		if o.Err != "" {
			s.Failed++
			continue
		}
		ttfts = append(ttfts, o.TTFT)
		if o.Cached == 0 {
			cold = append(cold, o.TTFT)
		}
		s.Prompt += o.Prompt
		s.Cached += o.Cached
		gen += o.Completion
		first, last = min(first, o.Start), max(last, o.End)
	}
	s.P50, s.P90, s.P99 = percentile(ttfts, 50), percentile(ttfts, 90), percentile(ttfts, 99)
	s.ColdTTFT = percentile(cold, 50)
	if span := (last - first).Seconds(); len(ttfts) > 0 && span > 0 {
		s.ReqPerSec = float64(len(ttfts)) / span
		s.PromptTokSec = float64(s.Prompt) / span
		s.GenTokSec = float64(gen) / span
	}
	return s
}

// percentile is the nearest-rank p-th percentile of ds (0 when empty).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// ratio is a/b, or 0 when b is 0.
func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// table renders the rows as markdown.
func table(rows []summary) string {
	var b strings.Builder
	b.WriteString("| routing | requests (failed) | TTFT p50 | p90 | p99 | cold prefill TTFT (median) | req/s | prompt tok/s | generated tok/s | prompt tokens restored (prefill saved) | restored: states / tokens | of them shared in flight | hot hits / misses | SSD hits / misses | routed |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, s := range rows {
		fmt.Fprintf(&b, "| `%s` | %d (%d) | %s | %s | %s | %s | %.2f | %.0f | %.1f | %d of %d (%.1f %%) | %d / %d | %d / %d | %d / %d | %d / %d | %s |\n",
			s.Mode, s.Requests, s.Failed, secs(s.P50), secs(s.P90), secs(s.P99), secs(s.ColdTTFT), s.ReqPerSec, s.PromptTokSec,
			s.GenTokSec, s.Cached, s.Prompt, 100*s.HitRate(), s.Tiers.Restores, s.Tiers.RestoredTokens,
			s.Tiers.InflightShares, s.Tiers.InflightSharedTokens, s.Tiers.HotHits, s.Tiers.HotMisses, s.Tiers.SSDHits, s.Tiers.SSDMisses,
			routedText(s.Routed))
	}
	return b.String()
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

func routedText(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if v > 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %.0f", k, m[k])
	}
	return strings.Join(parts, ", ")
}
