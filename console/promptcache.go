package console

import "fmt"

// PromptCache is a deployment's prompt cache counters, summed over its replicas'
// runners as their agents report them (GET /api/status, per model): every lookup of
// a request's prefix is a hot-tier hit, an SSD-tier hit or a miss.
type PromptCache struct {
	// HotHits and HotMisses count the hot tier's lookups (an SSD hit is also a hot
	// miss: the hot tier had nothing as deep); SSDHits the SSD tier's hits.
	HotHits, HotMisses, SSDHits int64
	// RestoredTokens are the prompt tokens restores spared from prefill.
	RestoredTokens int64
	// Replicas is how many replicas reported; Unreported how many Ready ones did not
	// (their agent did not answer in time).
	Replicas, Unreported int
}

// Add is c with o's counters added.
func (c PromptCache) Add(o PromptCache) PromptCache {
	return PromptCache{HotHits: c.HotHits + o.HotHits, HotMisses: c.HotMisses + o.HotMisses, SSDHits: c.SSDHits + o.SSDHits,
		RestoredTokens: c.RestoredTokens + o.RestoredTokens, Replicas: c.Replicas + o.Replicas, Unreported: c.Unreported + o.Unreported}
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

// promptCacheRow is c as a row. Bytes from peers reads "not yet": the runners do not
// fetch prefixes from peer Macs yet, so there is nothing to count.
func promptCacheRow(c PromptCache) PromptCacheRow {
	row := PromptCacheRow{Lookups: c.HotHits + c.HotMisses, Hot: "—", SSD: "—", Miss: "—",
		Restored: fmt.Sprintf("%d tokens restored", c.RestoredTokens), FromPeers: "not yet (no peer fetch)"}
	if row.Lookups > 0 {
		pct := func(n int64) string { return fmt.Sprintf("%.0f%%", 100*float64(n)/float64(row.Lookups)) }
		row.Hot, row.SSD, row.Miss = pct(c.HotHits), pct(c.SSDHits), pct(max(c.HotMisses-c.SSDHits, 0))
	}
	if c.Unreported > 0 {
		row.Note = fmt.Sprintf("%d of %d ready replicas did not report", c.Unreported, c.Unreported+c.Replicas)
	}
	return row
}
