//go:build cgo && !race

package server

import (
	"net/http"
	"sync"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// requestTable holds the generations in progress that a caller named
// (runnerapi.HeaderRequestID), so that POST /cancel can end one the way a stop condition
// does: its handler sends what was generated and the usage, instead of a dropped
// connection that takes the usage with it.
type requestTable struct {
	mu   sync.Mutex
	byID map[string][]*choice
}

// add registers the choices of request id and returns the function that removes them.
// A second request with the same id replaces the first in the table.
func (t *requestTable) add(id string, choices []*choice) func() {
	t.mu.Lock()
	if t.byID == nil {
		t.byID = map[string][]*choice{}
	}
	t.byID[id] = choices
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		if cs, ok := t.byID[id]; ok && &cs[0] == &choices[0] {
			delete(t.byID, id)
		}
		t.mu.Unlock()
	}
}

// cancel ends every unfinished job of request id with finish reason "cancelled"; the
// engine frees their slots at its next step and their generated counts stop where
// they are (a job that is done takes no more tokens). It reports whether the request
// was in progress.
func (t *requestTable) cancel(id string) bool {
	t.mu.Lock()
	choices, ok := t.byID[id]
	t.mu.Unlock()
	for _, c := range choices {
		c.j.complete(runnerapi.FinishCancelled)
	}
	return ok
}

func (t *requestTable) handleCancel(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.Cancel
	if err := readJSON(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.ID == "" {
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "id", "id must name a request (its %s)", runnerapi.HeaderRequestID))
		return
	}
	writeJSON(w, http.StatusOK, runnerapi.Cancelled{Found: t.cancel(req.ID)})
}
