//go:build cgo && !race

package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/tracing/spanrelay"
	"github.com/macfleet/macfleet/metal/runner/llama"
)

var knownPaths = map[string]bool{
	"/health": true, "/status": true, "/v1/chat/completions": true, "/v1/completions": true,
	"/v1/embeddings": true, "/tokenize": true, "/limits": true, "/cache/clear": true, "/cache/budget": true, "/cache/prefixes": true,
	"/cache/states": true, "/abort": true, "/cancel": true, "/shutdown": true,
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.run.handleHealth)
	mux.HandleFunc("GET /status", s.handleStatus)
	mux.HandleFunc("POST /v1/chat/completions", s.gen.traced(s.gen.handleChat))
	mux.HandleFunc("POST /v1/completions", s.gen.traced(s.gen.handleCompletion))
	mux.HandleFunc("POST /v1/embeddings", s.gen.handleEmbeddings)
	mux.HandleFunc("POST /tokenize", s.gen.handleTokenize)
	mux.HandleFunc("POST /limits", s.mem.handleLimits)
	mux.HandleFunc("POST /cache/clear", s.handleCacheClear)
	mux.HandleFunc("POST /cache/budget", s.cache.handleCacheBudget)
	mux.HandleFunc("GET /cache/prefixes", s.cache.handlePrefixes)
	mux.HandleFunc("GET /cache/states/{digest}", s.cache.handleExportState)
	mux.HandleFunc("POST /cache/states", s.cache.handleImportState)
	mux.HandleFunc("POST /abort", s.handleAbort)
	mux.HandleFunc("POST /cancel", s.gen.requests.handleCancel)
	mux.HandleFunc("POST /shutdown", s.run.handleShutdown)
	if s.cfg.Spans != nil {
		mux.Handle("POST "+spanrelay.Path, s.cfg.Spans)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if knownPaths[r.URL.Path] {
			writeError(w, &runnerapi.Error{Status: http.StatusMethodNotAllowed, Type: runnerapi.TypeInvalidRequest,
				Code: runnerapi.CodeMethodNotAllowed, Message: fmt.Sprintf("%s is not allowed on %s", r.Method, r.URL.Path)})
			return
		}
		writeError(w, &runnerapi.Error{Status: http.StatusNotFound, Type: runnerapi.TypeInvalidRequest,
			Code: runnerapi.CodeNotFound, Message: fmt.Sprintf("no such endpoint: %s %s", r.Method, r.URL.Path)})
	})
	return s.run.tracked(s.recoverer(mux))
}

// recoverer turns a handler panic into a 500 (if nothing was sent yet) instead of a
// dropped connection; the process keeps serving.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error(fmt.Errorf("%v", v), "Handler panicked", "path", r.URL.Path)
				writeError(w, runnerapi.Internal("internal error"))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(runnerapi.Internal("encoding the response: %v", err))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, e *runnerapi.Error) {
	if e.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, e.Status, e)
}

// readJSON reads and strictly decodes a bounded request body.
func readJSON(w http.ResponseWriter, r *http.Request, v any) *runnerapi.Error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &runnerapi.Error{Status: http.StatusRequestEntityTooLarge, Type: runnerapi.TypeInvalidRequest,
				Code: runnerapi.CodeInvalidValue, Message: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)}
		}
		return runnerapi.InvalidRequest(runnerapi.CodeInvalidJSON, "", "reading the body: %v", err)
	}
	return runnerapi.DecodeJSON(body, v)
}

func (s *Server) handleStatus(w http.ResponseWriter, _ *http.Request) {
	state, _, _ := s.run.get()
	st := runnerapi.Status{
		State: state, PID: pidSelf, FootprintBytes: s.mem.footprint(0), SlotsTotal: s.cfg.Parallel,
		CeilingBytes: s.mem.ceiling.Load(),
	}
	if state == runnerapi.StateReady || state == runnerapi.StateStopping {
		if s.eng != nil {
			st.SlotsBusy, st.KVCellsUsed, st.RequestsActive = s.eng.stats()
			st.KVCellsTotal = s.lm.nCtxSeq * s.cfg.Parallel
			info := s.lm.info
			st.Model = &info
			st.MetalAllocatedBytes = int64(llama.GPUAllocatedBytes())
			s.mem.fillDevices(&st)
			st.PromptCache, st.Off = s.cache.status(), append(s.cache.offPaths(), s.eng.offPaths()...)
			ci := s.lm.chat.info
			st.Chat = &ci
			st.Draft = s.draft.status()
			st.SplitHeadComputeSeconds = s.eng.headSeconds()
			st.FillerTokens, st.PaddedSteps = s.eng.fillers()
		}
	}
	if state != runnerapi.StateLoading {
		// The split workers' links, also once the runner has failed for one of them.
		nLayer := 0 // the model did not load
		if s.lm != nil {
			nLayer = s.lm.info.NLayer
		}
		st.Split = s.split.status(nLayer)
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) handleCacheClear(w http.ResponseWriter, _ *http.Request) {
	eng, herr := s.run.engine()
	if herr != nil {
		writeError(w, herr)
		return
	}
	before := s.mem.footprint(0)
	n := eng.clearIdle()
	hotBytes, hotEntries := s.cache.clearHot()
	llama.TrimHeap()
	after := s.mem.footprint(0)
	writeJSON(w, http.StatusOK, runnerapi.CacheClear{BytesReclaimed: max(0, before-after), EntriesCleared: n + hotEntries,
		HotEntriesCleared: hotEntries, HotBytesCleared: hotBytes})
}

func (s *Server) handleAbort(w http.ResponseWriter, _ *http.Request) {
	n := 0
	if eng, herr := s.run.engine(); herr == nil {
		n = eng.abortAll(runnerapi.Unavailable(runnerapi.CodeAborted, "the request was aborted by the node agent"))
	}
	writeJSON(w, http.StatusOK, runnerapi.Abort{Aborted: n})
}
