package server

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/macfleet/macfleet/internal/devicegauge"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/internal/version"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// StatusResponse is the body of GET /api/status: the pool's snapshot (per model: state,
// leases, active requests, estimated and resident bytes, last unload report, prompt
// cache counters and hot-tier share; pool:
// ceiling and what binds it, watermarks, usage, committed, pressure) and the agent's
// readiness.
type StatusResponse struct {
	Ready bool `json:"ready"`
	// Version is the agent's release (internal/version; "dev" for an unstamped build),
	// the one its MacNode reports in status.agent.version.
	Version string `json:"version"`
	enginepool.Snapshot
	// GatewayQueues are, per pool entry, the requests for its deployment waiting in
	// each gateway's queue, as the gateways last reported them (see GatewayQueueTTL).
	GatewayQueues map[string][]GatewayQueue `json:"gatewayQueues,omitempty"`
	// PeerFetches are, per pool entry, the prompt states this agent fetched from
	// other Macs (peer fetch): bytes received and fetches by result.
	PeerFetches map[string]PeerFetchStats `json:"peerFetches,omitempty"`
	// Accelerators are the node's cards with memory of their own, read from their
	// driver now (every process's use together); absent on a Mac.
	Accelerators []devicegauge.Card `json:"accelerators,omitempty"`
	// AcceleratorsError is why they could not be read.
	AcceleratorsError string `json:"acceleratorsError,omitempty"`
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	// The prompt cache counters are read from the runners now, not at the last poll.
	s.pool.RefreshPromptCacheStats()
	resp := StatusResponse{Ready: s.ready.Load(), Version: version.Get().Version, Snapshot: s.pool.Snapshot(),
		GatewayQueues: s.queues.snapshot(time.Now()), PeerFetches: s.peers.snapshot()}
	if g := s.opts.Accelerators; g != nil {
		var err error
		if resp.Accelerators, err = g.Cards(r.Context()); err != nil {
			resp.AcceleratorsError = err.Error()
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

// ModelActionResponse is the body of the load and unload endpoints.
type ModelActionResponse struct {
	Model string           `json:"model"`
	State enginepool.State `json:"state"`
	// Unloaded says whether this call stopped an engine (false: it was not loaded).
	Unloaded bool `json:"unloaded,omitempty"`
	// LastUnload is the model's latest unload report.
	LastUnload *enginepool.UnloadReport `json:"lastUnload,omitempty"`
	// Status is the model's full entry of /api/status.
	Status *enginepool.ModelSnapshot `json:"status,omitempty"`
}

func (s *Server) modelSnapshot(name string) *enginepool.ModelSnapshot {
	for _, m := range s.pool.Snapshot().Models {
		if m.Name == name || slices.Contains(m.Aliases, name) {
			return &m
		}
	}
	return nil
}

func (s *Server) actionResponse(name string) ModelActionResponse {
	out := ModelActionResponse{Model: name}
	if m := s.modelSnapshot(name); m != nil {
		out.Model, out.State, out.LastUnload, out.Status = m.Name, m.State, m.LastUnload, m
	}
	return out
}

// wantWait reads ?wait=true|false.
func wantWait(r *http.Request, def bool) (bool, *apiError) {
	v := r.URL.Query().Get("wait")
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, invalid(openaierr.CodeInvalidValue, "wait", "wait must be true or false, got %q", v)
	}
	return b, nil
}

// handleLoad loads a model: 200 once it is Ready; with ?wait=false, 202 at once while
// it loads in the background. Pool errors keep their status (404, 503, 507).
func (s *Server) handleLoad(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	wait, aerr := wantWait(r, true)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if s.modelSnapshot(id) == nil {
		writeError(w, fromPool(&enginepool.UnknownModelError{Model: id}))
		return
	}
	if !wait {
		// The pool bounds the load itself; this goroutine only reports its end.
		go func() {
			if err := s.pool.Load(context.WithoutCancel(r.Context()), id); err != nil {
				s.log.Info("Background load failed", "model", id, "err", err.Error())
			}
		}()
		writeJSON(w, http.StatusAccepted, s.actionResponse(id))
		return
	}
	if err := s.pool.Load(r.Context(), id); err != nil {
		if r.Context().Err() == nil {
			writeError(w, fromPool(err))
		}
		return
	}
	writeJSON(w, http.StatusOK, s.actionResponse(id))
}

// handleUnload unloads a model: 202 while it drains (the report appears in
// /api/status), 200 with the unload report once it is done — at once when it was
// not loaded, or after waiting with ?wait=true.
func (s *Server) handleUnload(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	wait, aerr := wantWait(r, false)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	before := s.modelSnapshot(id)
	if before == nil {
		writeError(w, fromPool(&enginepool.UnknownModelError{Model: id}))
		return
	}
	if wait {
		rep, err := s.pool.Unload(r.Context(), id)
		if err != nil {
			if r.Context().Err() == nil {
				writeError(w, fromPool(err))
			}
			return
		}
		out := s.actionResponse(id)
		out.Unloaded = rep != nil
		if rep != nil {
			out.LastUnload = rep
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	done, err := s.pool.StartUnload(id)
	if err != nil {
		writeError(w, fromPool(err))
		return
	}
	select {
	case <-done:
		out := s.actionResponse(id)
		out.Unloaded = before.State == enginepool.StateReady || before.State == enginepool.StateLoading ||
			before.State == enginepool.StateDraining || before.State == enginepool.StateStopping
		writeJSON(w, http.StatusOK, out)
	default:
		w.Header().Set("Location", "/api/status")
		writeJSON(w, http.StatusAccepted, s.actionResponse(id))
	}
}

// CacheClearResponse is the body of POST /api/cache/clear, summed over every runner:
// every runner still running — a model being unloaded included — drops its idle slots'
// prompt prefixes and its prompt cache hot tier (the SSD tier stays). BytesReclaimed is
// the drop of the runners' footprints measured from outside, EntriesCleared what the
// runners report they dropped.
type CacheClearResponse struct {
	BytesReclaimed int64                         `json:"bytes_reclaimed"`
	EntriesCleared int                           `json:"entries_cleared"`
	Runners        []enginepool.RunnerCacheClear `json:"runners"`
}

func (s *Server) handleCacheClear(w http.ResponseWriter, r *http.Request) {
	rep := s.pool.ClearCache(r.Context())
	out := CacheClearResponse{BytesReclaimed: rep.BytesReclaimed, Runners: rep.Runners}
	if out.Runners == nil {
		out.Runners = []enginepool.RunnerCacheClear{}
	}
	for _, rc := range rep.Runners {
		out.EntriesCleared += rc.EntriesCleared
	}
	writeJSON(w, http.StatusOK, out)
}
