package console

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// PromptCache is a deployment's prompt cache counters, summed over its replicas'
// runners as their agents report them (GET /api/status, per model): every lookup of
// a request's prefix is a hot-tier hit, an SSD-tier hit or a miss.
type PromptCache struct {
	// HotHits and HotMisses count the hot tier's lookups (an SSD hit is also a hot
	// miss: the hot tier had nothing as deep); SSDHits the SSD tier's hits.
	HotHits, HotMisses, SSDHits int64
	// RestoredTokens are the prompt tokens restores spared from prefill.
	RestoredTokens int64
	// PeerBytes are the bytes of prompt state the replicas' agents received from other
	// Macs (peer fetch), and PeerFetches their fetches by result ("imported", or why
	// nothing was restored).
	PeerBytes   int64
	PeerFetches map[string]int64
	// Replicas is how many replicas reported; Unreported how many Ready ones did not
	// (their agent did not answer in time).
	Replicas, Unreported int
}

// Add is c with o's counters added.
func (c PromptCache) Add(o PromptCache) PromptCache {
	sum := PromptCache{HotHits: c.HotHits + o.HotHits, HotMisses: c.HotMisses + o.HotMisses, SSDHits: c.SSDHits + o.SSDHits,
		RestoredTokens: c.RestoredTokens + o.RestoredTokens, PeerBytes: c.PeerBytes + o.PeerBytes,
		Replicas: c.Replicas + o.Replicas, Unreported: c.Unreported + o.Unreported}
	for _, m := range []map[string]int64{c.PeerFetches, o.PeerFetches} {
		for r, n := range m {
			if sum.PeerFetches == nil {
				sum.PeerFetches = map[string]int64{}
			}
			sum.PeerFetches[r] += n
		}
	}
	return sum
}

// PromptCacheRow is PromptCache as the models page prints it: the share of lookups
// served by each tier and missed, and the bytes of prompt state fetched from peer Macs.
type PromptCacheRow struct {
	// Lookups is how many lookups the rates are of (0: none, the rates read "—").
	Lookups             int64
	Hot, SSD, Miss      string
	Restored, FromPeers string
	// Note says whose counters are missing, when some are.
	Note string
}

// promptCacheRow is c as a row.
func promptCacheRow(c PromptCache) PromptCacheRow {
	row := PromptCacheRow{Lookups: c.HotHits + c.HotMisses, Hot: "—", SSD: "—", Miss: "—",
		Restored: fmt.Sprintf("%d tokens restored", c.RestoredTokens), FromPeers: peerLine(c)}
	if row.Lookups > 0 {
		pct := func(n int64) string { return fmt.Sprintf("%.0f%%", 100*float64(n)/float64(row.Lookups)) }
		row.Hot, row.SSD, row.Miss = pct(c.HotHits), pct(c.SSDHits), pct(max(c.HotMisses-c.SSDHits, 0))
	}
	if c.Unreported > 0 {
		row.Note = fmt.Sprintf("%d of %d ready replicas did not report", c.Unreported, c.Unreported+c.Replicas)
	}
	return row
}

// peerLine is the bytes moved from other Macs and the fetches by result: "none
// fetched" before any, else e.g. "12.5 MiB (3 imported; 1 not_found)".
func peerLine(c PromptCache) string {
	if len(c.PeerFetches) == 0 {
		return "none fetched"
	}
	imported := c.PeerFetches["imported"]
	var misses []string
	for _, r := range slices.Sorted(maps.Keys(c.PeerFetches)) {
		if r != "imported" {
			misses = append(misses, fmt.Sprintf("%d %s", c.PeerFetches[r], r))
		}
	}
	s := fmt.Sprintf("%s (%d imported", byteSize(c.PeerBytes), imported)
	if len(misses) > 0 {
		s += "; " + strings.Join(misses, ", ")
	}
	return s + ")"
}

// byteSize is n in B, KiB, MiB or GiB, one decimal above bytes.
func byteSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/unit, 0
	for v >= unit && i < 2 {
		v, i = v/unit, i+1
	}
	return fmt.Sprintf("%.1f %s", v, []string{"KiB", "MiB", "GiB"}[i])
}
