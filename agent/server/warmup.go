package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/internal/pki"
)

// maxWarmBodyBytes bounds a warm-up request's body: runnerapi.MaxWarmHints hints,
// each a ticket of a few KiB (it carries the gateway's certificate chain).
const maxWarmBodyBytes = 1 << 20

// handleWarm is POST /api/models/{id}/states/warm (the gateways and the manager only,
// authorizeCertificate): it fetches each runnerapi.PeerStateHint of the body from the
// peer agent it names, one after another, with the code a request's hint uses
// (fetchHint), imports it into the model's runner under the partition its ticket
// names and with the hint's digest (so the runner's prefix events list it), and
// answers one runnerapi.PeerStateResult per hint. The whole is bounded by
// runnerapi.WarmTimeoutSeconds; hints not begun by then are answered unavailable.
func (s *Server) handleWarm(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req runnerapi.PeerWarmRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxWarmBodyBytes))
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil {
		writeError(w, invalid(openaierr.CodeInvalidValue, "hints", "the body must be a JSON warm-up request of at most %d bytes: %v", maxWarmBodyBytes, err))
		return
	}
	if len(req.Hints) == 0 || len(req.Hints) > runnerapi.MaxWarmHints {
		writeError(w, invalid(openaierr.CodeInvalidValue, "hints", "hints must list 1 to %d states, got %d", runnerapi.MaxWarmHints, len(req.Hints)))
		return
	}
	rn, err := s.pool.RunnerOf(id)
	if err != nil {
		writeError(w, fromPool(err))
		return
	}
	out := runnerapi.PeerWarmResponse{Results: make([]runnerapi.PeerStateResult, len(req.Hints))}
	if s.opts.Peers == nil || s.opts.Peers.Transport == nil {
		for i := range out.Results {
			out.Results[i] = runnerapi.PeerStateResult{Reason: runnerapi.PeerMissDisabled, Detail: "peer fetch is off on this agent"}
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), runnerapi.WarmTimeoutSeconds*time.Second)
	defer cancel()
	for i, hint := range req.Hints {
		if ctx.Err() != nil {
			out.Results[i] = runnerapi.PeerStateResult{Reason: runnerapi.PeerMissUnavailable,
				Detail: fmt.Sprintf("the warm-up took over %d s; not fetched", runnerapi.WarmTimeoutSeconds)}
			continue
		}
		start := time.Now()
		res := s.fetchHint(ctx, rn, hint, func(t pki.StateTicket) http.Header { return warmHeaders(t, hint) })
		out.Results[i] = s.settleFetch(id, start, res, true)
	}
	writeJSON(w, http.StatusOK, out)
}

// warmHeaders are the fleet headers a warm-up imports a state with: the partition
// the gateway signed into the state's ticket (never the caller's header: the runner
// checks the state's key against it, so a state imports only into its own
// partition), and the hint's digest, which the imported state then backs.
func warmHeaders(t pki.StateTicket, hint runnerapi.PeerStateHint) http.Header {
	h := http.Header{}
	if t.Partition != "" {
		h.Set(runnerapi.HeaderCachePartition, t.Partition)
	}
	h.Set(runnerapi.HeaderPrefixDigests, hint.Digest)
	return h
}
