package runnerapi

// The prefix index: what each runner's prompt cache holds, told to the gateways so
// they route a conversation to the replica that holds the longest part of it.
//
// The gateway cannot hash a prompt into the runner's token-block keys: that needs the
// model's vocabulary and chat template (megabytes per model, and the same rendering
// byte for byte). It hashes what it does see, the request's conversation, into
// prefix digests: digest i covers the conversation's head (system prompt and tools)
// and its first i messages, chained, seeded by the caller's cache partition. The
// gateway sends them with the request (HeaderPrefixDigests); the agent passes them on;
// the runner remembers which of its saved states backs each digest and reports the
// digests it holds, by tier, as events. The digests are routing hints only: a restore
// still matches the prompt's own tokens, so a wrong or forged digest costs a miss,
// never a wrong answer.

// HeaderPrefixDigests carries a request's prefix digests from the gateway through the
// agent to the runner: comma-separated, shallowest first, each 16 lowercase hex digits.
// At most MaxPrefixDigests are read; a malformed header is ignored (no digests).
const HeaderPrefixDigests = "X-Macfleet-Prefix-Digests"

// MaxPrefixDigests bounds the digests one request carries (the deepest are kept).
const MaxPrefixDigests = 64

// Prompt-cache tiers as prefix events name them.
const (
	TierHot = "hot"
	TierSSD = "ssd"
)

// PrefixEvent says that a digest is now backed by a state in Tier ("hot" or "ssd"),
// or no longer backed at all (Tier empty).
type PrefixEvent struct {
	Digest string `json:"d"`
	Tier   string `json:"t,omitempty"`
	// Tokens is how many prompt tokens the backing state spares (0 when evicted).
	Tokens int `json:"n,omitempty"`
}

// PrefixEvents is the answer to GET /cache/prefixes?epoch=E&after=N (the runner) and
// GET /api/models/{id}/prefixes?epoch=E&after=N (the agent, for that model's
// runner). Epoch names the runner process's index; Seq is the last event's number.
// When the caller's epoch differs or its after is too old for the runner's bounded
// event log, Reset is true and Events lists every digest currently held: the caller
// replaces what it knew. Otherwise Events are the changes after N, oldest first.
// A wait=<seconds> parameter (at most 30) holds the answer until there are events.
type PrefixEvents struct {
	Epoch  string        `json:"epoch"`
	Seq    uint64        `json:"seq"`
	Reset  bool          `json:"reset,omitempty"`
	Events []PrefixEvent `json:"events"`
	// BytesPerToken is the size of the runner's saved states per token they hold (its
	// latest save's or import's bytes, as a peer fetch moves them, over its tokens):
	// the gateway's first figure for whether fetching a state beats prefilling it. 0
	// when the runner saved nothing yet; a runner older than the field never sends it.
	BytesPerToken float64 `json:"bpt,omitempty"`
}
