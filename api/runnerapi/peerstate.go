package runnerapi

// Peer fetch: a replica that misses a prefix another Mac's replica of the same
// deployment holds fetches that state from the other Mac instead of prefilling it.
//
// The flow, for one request the gateway routes to replica R while replica P (another
// Mac) holds the request's prefix digest D in its index:
//
//  1. The gateway decides, by a pure function of the state's tokens, the measured
//     bytes per token, the measured link throughput and the model's measured prefill
//     rate, whether fetching is faster than prefilling. If so it adds
//     HeaderPeerState to the request it sends R's agent: where P's agent is, the
//     model on P, the digest, and a ticket the gateway signed that lets R's Mac
//     fetch exactly that digest of that model from P within a short lifetime.
//  2. R's agent (which takes the header from the gateways only) fetches
//     GET /api/models/{id}/states/{digest} from P's agent over mutual TLS with its
//     own Mac certificate, presenting the ticket (HeaderPeerTicket). P's agent
//     serves it only with a valid ticket naming the calling Mac; otherwise a Mac's
//     certificate reaches nothing on another Mac.
//  3. P's agent relays its runner's GET /cache/states/{digest} (the request's
//     HeaderCachePartition is the ticket's partition). The body is one prompt cache
//     entry in the runner's SSD file format: a header carrying the cache identity
//     (model file, engine format, context settings), the state's key, the payload's
//     length and CRC-32C, then the payload (the state's tokens and sequence state).
//  4. R's agent streams that body into its runner's POST /cache/states (with the
//     request's partition). The runner checks everything before it keeps anything:
//     the header's checksums, its own identity (another model file, engine format or
//     context setting is incompatible), the payload's checksum, and that the key is
//     the one the payload's tokens give in this partition. A state that passes goes
//     into the hot tier and the SSD tier like one the runner saved itself; anything
//     else is a miss with a reason (PeerStateResult.Reason), logged and counted by
//     R's agent, and the request is then served as if no peer had been asked.
//  5. R's agent forwards the request to its runner, which restores the prefix as
//     from its own tiers: the same tokens, so greedy output is the same as after a
//     full prefill.
//
// A fetch never delays a request by more than PeerFetchTimeoutSeconds: past it the agent
// gives up and the runner prefills.

// HeaderPeerState is the gateway's instruction to fetch a prefix from a peer, on a
// request to an agent: a JSON PeerStateHint. The agent drops it from any caller but
// a gateway, and never passes it to the runner.
const HeaderPeerState = "X-Macfleet-Peer-State"

// HeaderPeerTicket carries PeerStateHint.Ticket on the agent-to-agent fetch.
const HeaderPeerTicket = "X-Macfleet-Peer-Ticket"

// HeaderStateTokens, on a runner's or agent's GET .../states/{digest} answer, is how
// many tokens the state holds.
const HeaderStateTokens = "X-Macfleet-State-Tokens"

// HeaderPeerRestore, on the agent's answer to a request that carried
// HeaderPeerState, reports what the fetch did: a PeerStateResult as JSON. The
// gateway reads it to measure link throughput and count bytes moved.
const HeaderPeerRestore = "X-Macfleet-Peer-Restore"

// PeerFetchTimeoutSeconds bounds one fetch, from the first byte asked to the import answered.
const PeerFetchTimeoutSeconds = 10

// PeerStateHint names the state to fetch: the peer agent's base URL (https), the
// model's id on the peer, the prefix digest (16 hex digits), how many tokens the
// peer's state spares, and the gateway's ticket for the fetch.
type PeerStateHint struct {
	Agent  string `json:"agent"`
	Model  string `json:"model"`
	Digest string `json:"digest"`
	Tokens int    `json:"tokens,omitempty"`
	Ticket string `json:"ticket"`
}

// PeerStateResult is the runner's answer to POST /cache/states and, in
// HeaderPeerRestore, the agent's report of a fetch. Imported is true when the state
// is now in the runner's tiers; otherwise Reason says why not (one of the
// PeerMiss* reasons) and Detail gives the particulars.
type PeerStateResult struct {
	Imported bool   `json:"imported"`
	Tokens   int    `json:"tokens,omitempty"`
	Bytes    int64  `json:"bytes,omitempty"`
	Millis   int64  `json:"ms,omitempty"`
	Reason   string `json:"reason,omitempty"`
	Detail   string `json:"detail,omitempty"`
}

// Why a peer fetch restored nothing.
const (
	// PeerMissIncompatible: the state was saved by another model file, engine format
	// or context setting.
	PeerMissIncompatible = "incompatible"
	// PeerMissCorrupt: a checksum, length or format check failed.
	PeerMissCorrupt = "corrupt"
	// PeerMissKey: the key is not what the state's tokens give in the request's
	// partition (another partition's state, or a forged one).
	PeerMissKey = "key_mismatch"
	// PeerMissTooLarge: the state is bigger than the importing runner's tiers can hold
	// (or than its hard cap).
	PeerMissTooLarge = "too_large"
	// PeerMissNotFound: the peer holds no state for the digest (any more).
	PeerMissNotFound = "not_found"
	// PeerMissRefused: the peer refused the fetch (ticket, certificate).
	PeerMissRefused = "refused"
	// PeerMissUnavailable: the peer or the link failed, or the fetch timed out.
	PeerMissUnavailable = "unavailable"
	// PeerMissDisabled: this runner's prompt cache is off.
	PeerMissDisabled = "disabled"
)

// Warm-up: a replica that starts holding nothing (a new replica, or a new epoch of its
// runner) while replicas of its deployment on other Macs hold prefixes is warmed by a
// gateway, in the background, before any request reaches it: the gateway asks its
// agent POST /api/models/{id}/states/warm with a PeerWarmRequest, and the agent fetches
// the hints one after another exactly as before a request (steps 2 to 4 above), each
// imported into the partition its ticket names, and answers a PeerWarmResponse.

// MaxWarmHints bounds the hints of one warm-up request.
const MaxWarmHints = 16

// WarmTimeoutSeconds bounds a whole warm-up: hints not begun by then are answered
// unavailable without a fetch.
const WarmTimeoutSeconds = 60

// PeerWarmRequest is the body of POST /api/models/{id}/states/warm.
type PeerWarmRequest struct {
	Hints []PeerStateHint `json:"hints"`
}

// PeerWarmResponse answers it: one result per hint, in order.
type PeerWarmResponse struct {
	Results []PeerStateResult `json:"results"`
}
