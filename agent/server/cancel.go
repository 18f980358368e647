package server

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// Cancelling an answer without losing its usage. A gateway whose client went away
// does not drop its connection to the agent at once (that would cancel the runner's
// request and lose what the runner generated): it asks POST /api/requests/cancel to
// end the request it named (runnerapi.HeaderRequestID). The agent asks the request's runner
// to end it (the runner's POST /cancel); the runner ends it as it would at a stop
// condition, with its usage, and the agent sends that usage as the metering.Header
// trailer as for any answer.

// cancelTimeout bounds the agent's call to the runner's /cancel.
const cancelTimeout = 5 * time.Second

// requestRunners are the runners of the requests in progress that a gateway named.
type requestRunners struct {
	mu   sync.Mutex
	byID map[string]*namedRequest
}

// namedRequest is one entry of requestRunners.
type namedRequest struct{ rn enginepool.Runner }

// add registers request id as served by rn and returns the function that removes it
// (only it: a later request with the same id replaces it in the table).
func (t *requestRunners) add(id string, rn enginepool.Runner) func() {
	e := &namedRequest{rn: rn}
	t.mu.Lock()
	if t.byID == nil {
		t.byID = map[string]*namedRequest{}
	}
	t.byID[id] = e
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		if t.byID[id] == e {
			delete(t.byID, id)
		}
		t.mu.Unlock()
	}
}

func (t *requestRunners) get(id string) (enginepool.Runner, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.byID[id]; ok {
		return e.rn, true
	}
	return nil, false
}

// handleCancel serves POST /api/requests/cancel ({"id": …}): {"found": true} when the
// request's runner was generating it and now ends it with its usage; {"found":
// false} when no runner has it (still queued on the agent, or already answered), in
// which case the caller drops its connection as before.
func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.Cancel
	if _, ok := s.decodeRequest(w, r, &req, nil); !ok {
		return
	}
	if req.ID == "" {
		writeError(w, invalid(openaierr.CodeMissingField, "id", "id must name a request (the %s it was sent with)", runnerapi.HeaderRequestID))
		return
	}
	rn, ok := s.requests.get(req.ID)
	if !ok {
		writeJSON(w, http.StatusOK, runnerapi.Cancelled{})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), cancelTimeout)
	defer cancel()
	var out runnerapi.Cancelled
	if err := callRunner(ctx, rn, pathCancel, runnerapi.Cancel{ID: req.ID}, &out); err != nil {
		s.log.Info("Cancelling a request on its runner failed", "err", err.Error())
		writeJSON(w, http.StatusOK, runnerapi.Cancelled{})
		return
	}
	writeJSON(w, http.StatusOK, out)
}
