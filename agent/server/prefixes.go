package server

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/internal/openaierr"
)

// fleetHeaders are the request headers that only the fleet's own callers set: the
// gateway's cache partition (whose prefixes a request may hit) and its prefix digests
// (what the runner reports back as held). The agent passes them to the runner from an
// admin caller (a gateway's or the manager's certificate, the API key, or no
// authentication configured) and drops them from a tenant's token: a tenant's
// requests go to its own partition, as the gateway would have set it.
var fleetHeaders = []string{runnerapi.HeaderCachePartition, runnerapi.HeaderPrefixDigests}

// passFleetHeaders sets on out the fleetHeaders r may set (see fleetHeaders).
func passFleetHeaders(r *http.Request, out http.Header) {
	id, ok := tenancy.IdentityFrom(r.Context())
	if ok && !id.Admin {
		if p := id.CachePartition(); p != "" {
			out.Set(runnerapi.HeaderCachePartition, p)
		}
		return
	}
	for _, h := range fleetHeaders {
		if v := r.Header.Get(h); v != "" {
			out.Set(h, v) // the caller's, as the gateway found it
		}
	}
}

// prefixQuery is the query the agent sends the runner for a caller's: epoch and after
// as they are (after must be a number), wait at most maxPrefixWait.
func prefixQuery(q url.Values) (url.Values, *apiError) {
	fwd := url.Values{}
	if e := q.Get("epoch"); e != "" {
		fwd.Set("epoch", e)
	}
	if a := q.Get("after"); a != "" {
		if _, err := strconv.ParseUint(a, 10, 64); err != nil {
			return nil, invalid(openaierr.CodeInvalidValue, "after", "after must be an event number, got %q", a)
		}
		fwd.Set("after", a)
	}
	if v := q.Get("wait"); v != "" {
		sec, err := strconv.ParseFloat(v, 64)
		if err != nil || sec < 0 || math.IsNaN(sec) {
			return nil, invalid(openaierr.CodeInvalidValue, "wait", "wait must be a number of seconds, got %q", v)
		}
		fwd.Set("wait", strconv.FormatFloat(min(sec, maxPrefixWait.Seconds()), 'f', -1, 64))
	}
	return fwd, nil
}

// maxPrefixWait bounds a long poll on /api/models/{id}/prefixes (the runner's bound).
const maxPrefixWait = 30 * time.Second

// handlePrefixes is GET /api/models/{id}/prefixes?epoch=E&after=N&wait=S: the prefix
// events of the model's runner (runnerapi.PrefixEvents), relayed. wait is bounded by
// maxPrefixWait; a model without a ready runner is a 503.
func (s *Server) handlePrefixes(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	fwd, aerr := prefixQuery(r.URL.Query())
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	rn, err := s.pool.RunnerOf(id)
	if err != nil {
		writeError(w, fromPool(err))
		return
	}
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, rn.BaseURL()+"/cache/prefixes?"+fwd.Encode(), nil)
	if err != nil {
		writeError(w, fromPool(err))
		return
	}
	resp, err := rn.Client().Do(req)
	if err != nil {
		if r.Context().Err() == nil {
			writeError(w, &apiError{Status: http.StatusBadGateway, Type: openaierr.TypeServer, Code: openaierr.CodeUpstream,
				Message: fmt.Sprintf("the runner of model %q did not answer for its prefixes: %v", id, err)})
		}
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	var out runnerapi.PrefixEvents
	if err == nil && resp.StatusCode == http.StatusOK {
		err = json.Unmarshal(b, &out)
	}
	switch {
	case r.Context().Err() != nil:
		return
	case resp.StatusCode != http.StatusOK && json.Valid(b):
		upstreamStatus(resp, b).(*runnerError).write(w)
		return
	case err != nil || resp.StatusCode != http.StatusOK:
		writeError(w, &apiError{Status: http.StatusBadGateway, Type: openaierr.TypeServer, Code: openaierr.CodeUpstream,
			Message: fmt.Sprintf("the runner of model %q answered %d for its prefixes: %v", id, resp.StatusCode, err)})
		return
	}
	s.metrics.prefixEvents.WithLabelValues(id).Add(float64(len(out.Events)))
	writeJSON(w, http.StatusOK, out)
}
