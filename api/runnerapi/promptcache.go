package runnerapi

// PromptCacheStatus is the prompt cache part of GET /status: how the runner uses the
// cache and the counters of its two tiers (the hot tier in the runner's memory, the
// SSD tier under --prompt-cache-dir).
type PromptCacheStatus struct {
	// BlockTokens is the block size: states are keyed by block-aligned token prefixes.
	BlockTokens int `json:"block_tokens"`
	// Identity is what a state can be restored into (model and state format); Dir is
	// this model's SSD directory (empty without an SSD tier).
	Model  string `json:"model"`
	Format string `json:"format"`
	Dir    string `json:"dir,omitempty"`

	// Restores counts states restored into a slot, RestoredTokens the prompt tokens
	// they spared from prefill, RestoreFailures states llama.cpp refused (a miss).
	Restores        int64 `json:"restores"`
	RestoredTokens  int64 `json:"restored_tokens"`
	RestoreFailures int64 `json:"restore_failures"`
	// StatesSaved counts states taken from slots after a request; SaveSkipped those
	// not taken (no full block, or no tier could hold them).
	StatesSaved  int64 `json:"states_saved"`
	SavesSkipped int64 `json:"saves_skipped"`
	// SavesPending counts entries handed to the SSD tier that it has not accepted yet
	// (its queue is full for up to a second before it writes inline).
	SavesPending int64 `json:"saves_pending"`
	// PeerImports counts states a peer sent that POST /cache/states kept;
	// PeerImportMisses those it refused (see PeerStateResult.Reason); PeerExports the
	// states GET /cache/states/{digest} sent whole.
	PeerImports      int64 `json:"peer_imports,omitempty"`
	PeerImportMisses int64 `json:"peer_import_misses,omitempty"`
	PeerExports      int64 `json:"peer_exports,omitempty"`
	// InflightWaits counts requests that waited for a prefix another slot was
	// prefilling instead of prefilling it again; InflightShares those that then took
	// its KV (InflightSharedTokens the prompt tokens that spared, also counted in
	// Restores and RestoredTokens), InflightGiveUps those that prefilled normally
	// (the other request ended first, or the wait outlasted a prefill).
	InflightWaits        int64 `json:"inflight_waits"`
	InflightShares       int64 `json:"inflight_shares"`
	InflightSharedTokens int64 `json:"inflight_shared_tokens"`
	InflightGiveUps      int64 `json:"inflight_give_ups"`

	Hot PromptCacheHot  `json:"hot"`
	SSD *PromptCacheSSD `json:"ssd,omitempty"`
}

// PromptCacheHot is the hot tier: an LRU under a byte budget set by
// --prompt-cache-hot-bytes and POST /cache/budget.
type PromptCacheHot struct {
	Entries     int   `json:"entries"`
	Bytes       int64 `json:"bytes"`
	BudgetBytes int64 `json:"budget_bytes"`
	Hits        int64 `json:"hits"`
	Misses      int64 `json:"misses"`
	Puts        int64 `json:"puts"`
	Evictions   int64 `json:"evictions"`
	// Rejected counts states larger than the whole budget.
	Rejected int64 `json:"rejected"`
}

// PromptCacheSSD is the SSD tier. At rest saves = saves_persisted + duplicates +
// quota_rejects + cancelled + errors.
type PromptCacheSSD struct {
	Saves           int64 `json:"saves"`
	SavesPersisted  int64 `json:"saves_persisted"`
	Duplicates      int64 `json:"duplicates"`
	QuotaRejects    int64 `json:"quota_rejects"`
	Cancelled       int64 `json:"cancelled"`
	Errors          int64 `json:"errors"`
	Hits            int64 `json:"hits"`
	Misses          int64 `json:"misses"`
	Corrupt         int64 `json:"corrupt"`
	Evictions       int64 `json:"evictions"`
	UnlinkFailures  int64 `json:"unlink_failures"`
	InlineFallbacks int64 `json:"inline_fallbacks"`
	Entries         int   `json:"entries"`
	Bytes           int64 `json:"bytes"`
	ForeignBytes    int64 `json:"foreign_bytes"`
	ForeignFiles    int   `json:"foreign_files"`
	// QuotaBytes is the effective quota: min(--prompt-cache-ssd-bytes, 0.99 × (bytes
	// tracked + free disk)); FreeBytes the last free-disk reading (-1 when it failed).
	QuotaBytes int64 `json:"quota_bytes"`
	FreeBytes  int64 `json:"free_bytes"`
	Queued     int   `json:"queued"`
}

// CacheBudget is the body of POST /cache/budget: the agent moves hot-tier shares
// between its runners (and may change the SSD quota). Absent fields are unchanged.
type CacheBudget struct {
	HotBytes *int64 `json:"hot_bytes,omitempty"`
	SSDBytes *int64 `json:"ssd_bytes,omitempty"`
}

// CacheBudgetResult is the answer to POST /cache/budget: the budgets now in force and
// what the hot tier evicted to fit the new one.
type CacheBudgetResult struct {
	HotBytes       int64 `json:"hot_bytes"`
	SSDBytes       int64 `json:"ssd_bytes"`
	EvictedBytes   int64 `json:"evicted_bytes"`
	EvictedEntries int   `json:"evicted_entries"`
}

// Path names a way the runner reuses a model's state that it may serve a model
// without.
type Path string

const (
	// PathPromptCache is the prompt cache and every path through it: its hot and SSD
	// tiers, the states a peer exports or imports (/cache/states) and the in-flight
	// prefixes one request shares with another. Without it each request prefills its
	// whole prompt, but for what its slot still holds.
	PathPromptCache Path = "prompt_cache"
)

// PathOff is a path the runner serves the loaded model without, and why: a path that
// could not serve the model correctly is turned off, never taken to a wrong answer.
type PathOff struct {
	Path   Path   `json:"path"`
	Reason string `json:"reason"`
}
