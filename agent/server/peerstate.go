package server

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// Peer fetch, the agent's two sides (api/runnerapi/peerstate.go has the flow):
//
//   - as the source, GET /api/models/{id}/states/{digest} relays the model's runner's
//     GET /cache/states/{digest} to a gateway, the manager, or a Mac whose
//     certificate comes with a gateway's ticket for exactly that state
//     (authorizeCertificate); for a Mac the cache partition is the ticket's;
//   - as the target, a generation request from a gateway that carries
//     runnerapi.HeaderPeerState first fetches the state from the peer agent the hint
//     names, over mutual TLS with this Mac's own certificate, and streams it into its
//     runner's POST /cache/states; whatever happens the request is then served (a
//     miss is a prefill), and the answer says what the fetch did
//     (runnerapi.HeaderPeerRestore).

// PeerOptions are what peer fetch needs of the agent's identity.
type PeerOptions struct {
	// Node is this agent's Mac (its MacNode's name): the source a ticket must name.
	Node string
	// Roots is the fleet CA bundle tickets are checked against (the agent's own,
	// pki.Source.Roots).
	Roots func() *x509.CertPool
	// Transport reaches other Macs' agents with this Mac's certificate; a request
	// names the Mac its peer must be (pki.WithNode): pki.Transports.
	Transport http.RoundTripper
	// Now is the clock tickets are checked at; nil means time.Now.
	Now func() time.Time
}

// ticketCheck is what authorizeCertificate checks a Mac's ticket against now.
func (s *Server) ticketCheck() ticketCheck {
	p := s.opts.Peers
	if p == nil || p.Node == "" || p.Roots == nil {
		return ticketCheck{}
	}
	now := time.Now
	if p.Now != nil {
		now = p.Now
	}
	return ticketCheck{node: p.Node, roots: p.Roots(), now: now()}
}

// isStatePath: escaped is /api/models/{id}/states/{digest}.
func isStatePath(escaped string) bool {
	_, _, ok := statePath(escaped)
	return ok
}

// maxPeerAnswerBytes bounds the runner's JSON answer to an import.
const maxPeerAnswerBytes = 64 << 10

// handleState is GET /api/models/{id}/states/{digest}: the runner's export of the
// state, relayed as it streams. The partition is a Mac's ticket's, or an admin's
// runnerapi.HeaderCachePartition.
func (s *Server) handleState(w http.ResponseWriter, r *http.Request) {
	id, digest := r.PathValue("id"), r.PathValue("digest")
	rn, err := s.pool.RunnerOf(id)
	if err != nil {
		writeError(w, fromPool(err))
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, rn.BaseURL()+"/cache/states/"+url.PathEscape(digest), nil)
	if err != nil {
		writeError(w, fromPool(err))
		return
	}
	partition := r.Header.Get(runnerapi.HeaderCachePartition)
	if t := callerOf(r).ticket; t != nil {
		partition = t.Partition
	}
	if partition != "" {
		req.Header.Set(runnerapi.HeaderCachePartition, partition)
	}
	resp, err := rn.Client().Do(req)
	if err != nil {
		if r.Context().Err() == nil {
			writeError(w, &apiError{Status: http.StatusBadGateway, Type: openaierr.TypeServer, Code: openaierr.CodeUpstream,
				Message: fmt.Sprintf("the runner of model %q did not answer for state %s: %v", id, digest, err)})
		}
		return
	}
	defer resp.Body.Close()
	for _, h := range []string{"Content-Type", "Content-Length", runnerapi.HeaderStateTokens} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	n, err := io.Copy(w, resp.Body)
	if err != nil && r.Context().Err() == nil {
		s.log.Info("Serving a prompt state broke off", "model", id, "digest", digest, "bytes", n, "err", err.Error())
	}
	if resp.StatusCode == http.StatusOK {
		s.peers.served.WithLabelValues(id).Add(float64(n))
	}
}

// peerRestore follows a gateway's runnerapi.HeaderPeerState, v (not empty), on a
// generation request for model (served by rn) before it is forwarded: it fetches the
// state, imports it, counts and logs the outcome and puts it on the answer
// (runnerapi.HeaderPeerRestore). The hint of any other caller is ignored (the header
// is never passed to a runner).
func (s *Server) peerRestore(w http.ResponseWriter, r *http.Request, rn enginepool.Runner, model, v string) {
	if s.opts.Peers == nil || s.opts.Peers.Transport == nil || !callerOf(r).gateway {
		return
	}
	start := time.Now()
	res := s.settleFetch(model, start, s.fetchPeerState(r, rn, v), false)
	if b, err := json.Marshal(res); err == nil {
		w.Header().Set(runnerapi.HeaderPeerRestore, string(b))
	}
}

// settleFetch completes res, a fetch for model begun at start (its time; a miss
// without a reason is unavailable), counts and logs it (warm: a warm-up's).
func (s *Server) settleFetch(model string, start time.Time, res runnerapi.PeerStateResult, warm bool) runnerapi.PeerStateResult {
	res.Millis = time.Since(start).Milliseconds()
	if !res.Imported && res.Reason == "" {
		res.Reason = runnerapi.PeerMissUnavailable
	}
	s.peers.record(model, res, warm)
	switch {
	case res.Imported:
		s.log.V(1).Info("Restored a prefix from a peer Mac", "model", model, "warmup", warm, "tokens", res.Tokens, "bytes", res.Bytes, "ms", res.Millis)
	case warm:
		s.log.Info("A warm-up fetch from a peer restored nothing", "model", model, "reason", res.Reason,
			"detail", res.Detail, "bytes", res.Bytes, "ms", res.Millis)
	default:
		s.log.Info("Peer fetch restored nothing; the request is prefilled", "model", model, "reason", res.Reason,
			"detail", res.Detail, "bytes", res.Bytes, "ms", res.Millis)
	}
	return res
}

// fetchPeerState does one fetch and import for the hint v (JSON), within
// runnerapi.PeerFetchTimeoutSeconds of the request's context, importing with the
// request's partition and digests.
func (s *Server) fetchPeerState(r *http.Request, rn enginepool.Runner, v string) runnerapi.PeerStateResult {
	var hint runnerapi.PeerStateHint
	if err := json.Unmarshal([]byte(v), &hint); err != nil {
		return runnerapi.PeerStateResult{Detail: "the gateway's hint is not JSON: " + err.Error()}
	}
	return s.fetchHint(r.Context(), rn, hint, func(pki.StateTicket) http.Header {
		h := http.Header{}
		passFleetHeaders(r, h)
		return h
	})
}

// fetchHint fetches the state hint names from the peer agent and imports it into rn
// with the fleet headers (partition, digests) importHeaders gives for the hint's
// ticket, within runnerapi.PeerFetchTimeoutSeconds of ctx.
func (s *Server) fetchHint(ctx context.Context, rn enginepool.Runner, hint runnerapi.PeerStateHint,
	importHeaders func(pki.StateTicket) http.Header) runnerapi.PeerStateResult {
	claims, err := pki.TicketClaims(hint.Ticket)
	if err != nil {
		return runnerapi.PeerStateResult{Reason: runnerapi.PeerMissRefused, Detail: err.Error()}
	}
	if !strings.HasPrefix(hint.Agent, "https://") {
		return runnerapi.PeerStateResult{Reason: runnerapi.PeerMissRefused, Detail: "the peer agent " + hint.Agent + " is not https"}
	}
	ctx, cancel := context.WithTimeout(ctx, runnerapi.PeerFetchTimeoutSeconds*time.Second)
	defer cancel()
	u := strings.TrimSuffix(hint.Agent, "/") + "/api/models/" + url.PathEscape(hint.Model) + "/states/" + url.PathEscape(hint.Digest)
	req, err := http.NewRequestWithContext(pki.WithNode(ctx, claims.Source), http.MethodGet, u, nil)
	if err != nil {
		return runnerapi.PeerStateResult{Detail: err.Error()}
	}
	req.Header.Set(runnerapi.HeaderPeerTicket, hint.Ticket)
	resp, err := s.opts.Peers.Transport.RoundTrip(req)
	if err != nil {
		return runnerapi.PeerStateResult{Detail: "fetching from Mac " + claims.Source + ": " + err.Error()}
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusForbidden, http.StatusUnauthorized:
		return runnerapi.PeerStateResult{Reason: runnerapi.PeerMissRefused, Detail: peerStatus(claims.Source, resp)}
	case http.StatusNotFound:
		return runnerapi.PeerStateResult{Reason: runnerapi.PeerMissNotFound, Detail: peerStatus(claims.Source, resp)}
	default:
		return runnerapi.PeerStateResult{Detail: peerStatus(claims.Source, resp)}
	}
	body := &countingReader{r: resp.Body}
	res := s.importState(ctx, rn, body, resp.ContentLength, importHeaders(claims))
	res.Bytes = body.n
	return res
}

// peerStatus describes a peer agent's refusal.
func peerStatus(mac string, resp *http.Response) string {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	return fmt.Sprintf("Mac %s answered %d: %s", mac, resp.StatusCode, strings.TrimSpace(string(b)))
}

// importState streams body (length n, -1 unknown) into rn's POST /cache/states with
// the fleet headers fleet (the partition and digests), and returns the runner's verdict.
func (s *Server) importState(ctx context.Context, rn enginepool.Runner, body io.Reader, n int64, fleet http.Header) runnerapi.PeerStateResult {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rn.BaseURL()+"/cache/states", body)
	if err != nil {
		return runnerapi.PeerStateResult{Detail: err.Error()}
	}
	req.ContentLength = n
	req.Header.Set("Content-Type", "application/octet-stream")
	for k, v := range fleet {
		req.Header[k] = v
	}
	resp, err := rn.Client().Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return runnerapi.PeerStateResult{Detail: fmt.Sprintf("the fetch took over %d s", runnerapi.PeerFetchTimeoutSeconds)}
		}
		return runnerapi.PeerStateResult{Detail: "importing into the runner: " + err.Error()}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxPeerAnswerBytes))
	var res runnerapi.PeerStateResult
	if err == nil {
		err = json.Unmarshal(b, &res)
	}
	if err != nil || (!res.Imported && res.Reason == "" && resp.StatusCode/100 != 2) {
		return runnerapi.PeerStateResult{Detail: fmt.Sprintf("the runner answered the import %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))}
	}
	return res
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// PeerFetchStats are a model's peer fetches as this agent made them (GET
// /api/status, peerFetches): the bytes received from other Macs and the fetches by
// result (imported, or the miss reason), warm-ups (POST .../states/warm) included;
// Warmups are the warm-ups alone, by result.
type PeerFetchStats struct {
	Bytes   int64            `json:"bytes"`
	Results map[string]int64 `json:"results"`
	Warmups map[string]int64 `json:"warmups,omitempty"`
}

// peerMetrics count the agent's peer fetches: its metrics and the per-model
// counters of /api/status.
type peerMetrics struct {
	fetches *prometheus.CounterVec
	bytes   *prometheus.CounterVec
	served  *prometheus.CounterVec
	warmups *prometheus.CounterVec

	mu      sync.Mutex
	byModel map[string]*PeerFetchStats
}

func newPeerMetrics() *peerMetrics {
	return &peerMetrics{
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_agent_peer_fetches_total",
			Help: "Prompt states this agent fetched from another Mac before a request or to warm up, by model and result (imported, or why not).",
		}, []string{"model", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_agent_peer_fetch_bytes_total",
			Help: "Bytes of prompt state this agent received from other Macs' agents, by model.",
		}, []string{"model"}),
		served: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_agent_peer_served_bytes_total",
			Help: "Bytes of prompt state this agent served on GET /api/models/{id}/states/{digest}, by model.",
		}, []string{"model"}),
		warmups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "macfleet_agent_peer_warmups_total",
			Help: "Prompt states this agent fetched from another Mac to warm a replica (POST /api/models/{id}/states/warm), by model and result; " +
				"they are counted in macfleet_agent_peer_fetches_total too.",
		}, []string{"model", "result"}),
		byModel: map[string]*PeerFetchStats{},
	}
}

func (m *peerMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.fetches, m.bytes, m.served, m.warmups}
}

// record counts one fetch for model (warm: a warm-up's, not a request's).
func (m *peerMetrics) record(model string, res runnerapi.PeerStateResult, warm bool) {
	result := res.Reason
	if res.Imported {
		result = "imported"
	}
	m.fetches.WithLabelValues(model, result).Inc()
	if warm {
		m.warmups.WithLabelValues(model, result).Inc()
	}
	m.bytes.WithLabelValues(model).Add(float64(res.Bytes))
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.byModel[model]
	if st == nil {
		st = &PeerFetchStats{Results: map[string]int64{}}
		m.byModel[model] = st
	}
	st.Bytes += res.Bytes
	st.Results[result]++
	if warm {
		if st.Warmups == nil {
			st.Warmups = map[string]int64{}
		}
		st.Warmups[result]++
	}
}

// snapshot is a copy of the per-model counters (nil when none).
func (m *peerMetrics) snapshot() map[string]PeerFetchStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.byModel) == 0 {
		return nil
	}
	out := make(map[string]PeerFetchStats, len(m.byModel))
	for k, v := range m.byModel {
		out[k] = PeerFetchStats{Bytes: v.Bytes, Results: maps.Clone(v.Results), Warmups: maps.Clone(v.Warmups)}
	}
	return out
}
