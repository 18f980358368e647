//go:build cgo && !race

package server

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat"
	"github.com/macfleet/macfleet/internal/tracing/spanrelay"
	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
	"github.com/macfleet/macfleet/metal/runner/llama"
)

var knownPaths = map[string]bool{
	"/health": true, "/status": true, "/v1/chat/completions": true, "/v1/completions": true,
	"/v1/embeddings": true, "/tokenize": true, "/limits": true, "/cache/clear": true, "/cache/budget": true, "/cache/prefixes": true,
	"/cache/states": true, "/abort": true, "/cancel": true, "/shutdown": true,
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.handleHealth)
	mux.HandleFunc("GET /status", s.handleStatus)
	mux.HandleFunc("POST /v1/chat/completions", s.traced(s.handleChat))
	mux.HandleFunc("POST /v1/completions", s.traced(s.handleCompletion))
	mux.HandleFunc("POST /v1/embeddings", s.handleEmbeddings)
	mux.HandleFunc("POST /tokenize", s.handleTokenize)
	mux.HandleFunc("POST /limits", s.handleLimits)
	mux.HandleFunc("POST /cache/clear", s.handleCacheClear)
	mux.HandleFunc("POST /cache/budget", s.handleCacheBudget)
	mux.HandleFunc("GET /cache/prefixes", s.handlePrefixes)
	mux.HandleFunc("GET /cache/states/{digest}", s.handleExportState)
	mux.HandleFunc("POST /cache/states", s.handleImportState)
	mux.HandleFunc("POST /abort", s.handleAbort)
	mux.HandleFunc("POST /cancel", s.handleCancel)
	mux.HandleFunc("POST /shutdown", s.handleShutdown)
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
	return s.tracked(s.recoverer(mux))
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

// readReady is the preamble of every endpoint that needs the loaded model (chat,
// completions, embeddings, tokenize): the ready engine, then req strictly decoded from
// the body, answering the first error. On failure it has written the error and
// returns nil.
func (s *Server) readReady(w http.ResponseWriter, r *http.Request, req any) *engineSet {
	eng, herr := s.readyEngine()
	if herr == nil {
		herr = readJSON(w, r, req)
	}
	if herr != nil {
		writeError(w, herr)
		return nil
	}
	return eng
}

// generationRequest is a chat or text completion request: api/runnerapi gives both
// their sampling options and their cross-field checks.
type generationRequest interface {
	Options() (runnerapi.Options, *runnerapi.Error)
	Check() *runnerapi.Error
}

// readGeneration is the preamble the chat and completion handlers share: readReady,
// then req's options, then its checks, answering the first error. On failure it has
// written the error and returns a nil engine.
func (s *Server) readGeneration(w http.ResponseWriter, r *http.Request, req generationRequest) (*engineSet, runnerapi.Options) {
	eng := s.readReady(w, r, req)
	if eng == nil {
		return nil, runnerapi.Options{}
	}
	opts, herr := req.Options()
	if herr == nil {
		herr = req.Check()
	}
	if herr != nil {
		writeError(w, herr)
		return nil, runnerapi.Options{}
	}
	return eng, opts
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	state, progress, loadErr := s.getState()
	h := runnerapi.Health{Status: state, Progress: progress, Nonce: s.cfg.Nonce}
	status := http.StatusServiceUnavailable
	switch state {
	case runnerapi.StateReady:
		status = http.StatusOK
	case runnerapi.StateFailed:
		h.Error = loadErr
		defer s.failureSeenOnce.Do(func() { close(s.failureSeen) })
	}
	writeJSON(w, status, h)
}

func (s *Server) handleStatus(w http.ResponseWriter, _ *http.Request) {
	state, _, _ := s.getState()
	st := runnerapi.Status{
		State: state, PID: pidSelf, FootprintBytes: s.footprint(0), SlotsTotal: s.cfg.Parallel,
		CeilingBytes: s.ceiling.Load(),
	}
	if state == runnerapi.StateReady || state == runnerapi.StateStopping {
		if s.eng != nil {
			st.SlotsBusy, st.KVCellsUsed, st.RequestsActive = s.eng.stats()
			st.KVCellsTotal = s.nCtxSeq * s.cfg.Parallel
			info := s.info
			st.Model = &info
			st.MetalAllocatedBytes = int64(llama.GPUAllocatedBytes())
			s.fillDevices(&st)
			st.PromptCache = s.promptCacheStatus()
			ci := s.chatInfo
			st.Chat = &ci
			st.SplitHeadComputeSeconds = s.eng.headSeconds()
		}
	}
	if state != runnerapi.StateLoading {
		// The split workers' links, also once the runner has failed for one of them.
		st.Split = s.splitStatus()
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) handleLimits(w http.ResponseWriter, r *http.Request) {
	var l runnerapi.Limits
	if err := readJSON(w, r, &l); err != nil {
		writeError(w, err)
		return
	}
	if l.CeilingBytes < 0 || l.HardLimitBytes < 0 || l.HostUsedBytes < 0 {
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "ceiling_bytes", "limits must not be negative"))
		return
	}
	s.ceiling.Store(l.CeilingBytes)
	writeJSON(w, http.StatusOK, l)
}

func (s *Server) handleCacheClear(w http.ResponseWriter, _ *http.Request) {
	eng, herr := s.readyEngine()
	if herr != nil {
		writeError(w, herr)
		return
	}
	before := s.footprint(0)
	n := eng.clearIdle()
	hotBytes, hotEntries := s.clearPromptCacheHot()
	llama.TrimHeap()
	after := s.footprint(0)
	writeJSON(w, http.StatusOK, runnerapi.CacheClear{BytesReclaimed: max(0, before-after), EntriesCleared: n + hotEntries,
		HotEntriesCleared: hotEntries, HotBytesCleared: hotBytes})
}

func (s *Server) handleAbort(w http.ResponseWriter, _ *http.Request) {
	n := 0
	if eng, herr := s.readyEngine(); herr == nil {
		n = eng.abortAll(runnerapi.Unavailable(runnerapi.CodeAborted, "the request was aborted by the node agent"))
	}
	writeJSON(w, http.StatusOK, runnerapi.Abort{Aborted: n})
}

func (s *Server) handleShutdown(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusAccepted, map[string]string{"status": runnerapi.StateStopping})
	s.requestStop()
}

func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.TokenizeRequest
	if s.readReady(w, r, &req) == nil {
		return
	}
	addSpecial := req.AddSpecial == nil || *req.AddSpecial
	var text string
	parseSpecial := false
	switch {
	case (req.Content != nil && req.Messages != nil) || (req.Chat != nil && (req.Content != nil || req.Messages != nil)):
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "content", "give one of content, messages and chat"))
		return
	case req.Content != nil:
		text = *req.Content
	case req.Messages != nil:
		prompt, herr := s.renderChat(&runnerapi.ChatRequest{Messages: req.Messages})
		if herr != nil {
			writeError(w, herr)
			return
		}
		text, parseSpecial = prompt, true
	case req.Chat != nil:
		var chatReq runnerapi.ChatRequest
		if herr := runnerapi.DecodeJSON(req.Chat, &chatReq); herr != nil {
			writeError(w, herr)
			return
		}
		if herr := chatReq.Check(); herr != nil {
			writeError(w, herr)
			return
		}
		prompt, herr := s.renderChat(&chatReq)
		if herr != nil {
			writeError(w, herr)
			return
		}
		text, parseSpecial = prompt, true
	default:
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "content", "content or messages is required"))
		return
	}
	toks, err := s.model.Tokenize(text, addSpecial, parseSpecial)
	if err != nil {
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "content", "tokenizing: %v", err))
		return
	}
	writeJSON(w, http.StatusOK, runnerapi.TokenizeResponse{Tokens: toks, Count: len(toks)})
}

func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.CompletionRequest
	eng, opts := s.readGeneration(w, r, &req)
	if eng == nil {
		return
	}
	if req.Prompt == nil || req.Prompt.Len() != 1 {
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "prompt", "prompt must be one string or one array of token ids"))
		return
	}
	if req.Echo {
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "echo", "echo is not supported"))
		return
	}
	toks, herr := s.inputTokens(*req.Prompt, 0, "prompt", true)
	if herr != nil {
		writeError(w, herr)
		return
	}
	text := ""
	if req.Prompt.Texts != nil {
		text = req.Prompt.Texts[0]
	}
	s.generate(w, r, eng, nil, s.modelName(req.Model), text, toks, opts)
}

// inputTokens tokenizes input i of in (text gets BOS; token ids are checked).
func (s *Server) inputTokens(in runnerapi.Input, i int, param string, parseSpecial bool) ([]int32, *runnerapi.Error) {
	if in.Texts != nil {
		toks, err := s.model.Tokenize(in.Texts[i], true, parseSpecial)
		if err != nil {
			return nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param, "tokenizing: %v", err)
		}
		return toks, nil
	}
	toks := in.Tokens[i]
	n := int32(s.info.NVocab)
	for _, t := range toks {
		if t < 0 || t >= n {
			return nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param, "token id %d is outside the vocabulary (0..%d)", t, n-1)
		}
	}
	return toks, nil
}

// generate runs a chat (co set) or text completion job and writes its response.
// text is the prompt's text when it was tokenized from one ("" for token ids).
func (s *Server) generate(w http.ResponseWriter, r *http.Request, eng *engineSet, co *chat.Options, model string,
	text string, toks []int32, opts runnerapi.Options) {
	isChat := co != nil
	param := "prompt"
	if isChat {
		param = "messages"
	}
	if len(toks) == 0 {
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param, "the prompt is empty"))
		return
	}
	var restore *restoreState
	var lookup lookupSpan
	partition := cachePartition(r.Header.Get(runnerapi.HeaderCachePartition), opts.CacheSalt)
	digests := promptcache.ParseDigests(r.Header.Get(runnerapi.HeaderPrefixDigests))
	if len(toks) < s.nCtxSeq && !opts.Spent { // a spent answer prefills nothing
		lookup.start = time.Now()
		restore, toks = s.lookupPrompt(text, toks, partition)
		lookup.end, lookup.restore = time.Now(), restore
	}
	if len(toks) >= s.nCtxSeq {
		writeError(w, runnerapi.ContextExceeded(len(toks), s.nCtxSeq))
		return
	}
	if herr := s.guard(len(toks)); herr != nil {
		writeError(w, herr)
		return
	}
	if opts.N > eng.slotCount() {
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "n",
			"n is %d but this model serves at most %d sequences at once (its parallel slots)", opts.N, eng.slotCount()))
		return
	}
	out := responder{w: w, chat: isChat, id: runnerapi.NewID(map[bool]string{true: "chatcmpl-", false: "cmpl-"}[isChat]),
		created: time.Now().Unix(), model: model, promptTokens: len(toks), continuedPrompt: opts.ContinuedPrompt, continued: opts.Continued,
		tokenCounts: opts.Stream && r.Header.Get(runnerapi.HeaderTokenCounts) == runnerapi.TokenCountComments, includeUsage: opts.IncludeUsage,
		usageFirst: opts.Stream && opts.IncludeUsage && r.Header.Get(runnerapi.HeaderPromptUsage) == "first-chunk",
		logprobs:   opts.Logprobs, notify: make(chan struct{}, 1)}
	for i := range opts.N {
		o := opts
		o.Seed += uint32(i) // each choice its own reproducible sequence
		j := newJob(r.Context(), toks, o, false)
		j.notify, j.partition, j.digests = out.notify, partition, digests
		if i == 0 {
			j.restore = restore
		}
		if isChat && (co.Tools || co.Thinking) {
			j.special = s.markers
		}
		c := &choice{index: i, j: j}
		if isChat {
			c.parser = chat.NewParser(*co)
			j.grammarPrefix = co.Continued
		}
		out.choices = append(out.choices, c)
	}
	// Known by its id before any job runs, so a cancel that comes once they generate
	// finds them.
	if id := r.Header.Get(runnerapi.HeaderRequestID); id != "" {
		defer s.requests.add(id, out.choices)()
	}
	for _, c := range out.choices {
		if opts.Spent {
			c.j.complete("length") // nothing left of max_tokens to generate
		} else if herr := eng.submit(c.j); herr != nil {
			writeError(w, herr)
			return
		}
	}
	if opts.Stream {
		out.stream(r)
	} else {
		out.whole(r)
	}
	s.traceJob(r.Context(), lookup, out.choices[0].j)
}

// cachePartition is the prompt cache partition of a request in partition (the
// gateway's HeaderCachePartition) with cache_salt salt: the partition itself without
// a salt, so that a partition's prefixes are shared by its requests.
func cachePartition(partition, salt string) string {
	if salt == "" {
		return partition
	}
	return partition + "\x00salt\x00" + salt
}

func ptr[T any](v T) *T { return &v }

func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.EmbeddingRequest
	eng := s.readReady(w, r, &req)
	if eng == nil {
		return
	}
	if herr := embeddingProblem(req, s.info.NEmbd); herr != nil {
		writeError(w, herr)
		return
	}
	jobs, total, herr := s.embeddingJobs(r, *req.Input)
	if herr != nil {
		writeError(w, herr)
		return
	}
	for _, j := range jobs {
		if herr := eng.submit(j); herr != nil {
			writeError(w, herr)
			return
		}
	}
	resp := runnerapi.EmbeddingResponse{Object: "list", Model: s.modelName(req.Model),
		Usage: runnerapi.Usage{PromptTokens: total, TotalTokens: total}}
	for i, j := range jobs {
		vec, ok := awaitEmbedding(w, r, j)
		if !ok {
			return
		}
		resp.Data = append(resp.Data, runnerapi.Embedding{Object: "embedding", Index: i,
			Embedding: encodeEmbedding(vec, req.EncodingFormat)})
	}
	writeJSON(w, http.StatusOK, resp)
}

// embeddingProblem is what is wrong with an embedding request's own fields, or nil;
// nEmbd is the model's embedding size.
func embeddingProblem(req runnerapi.EmbeddingRequest, nEmbd int) *runnerapi.Error {
	switch {
	case req.Input == nil || req.Input.Len() == 0:
		return runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "input", "input is required")
	case req.Input.Len() > 2048:
		return runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "input", "at most 2048 inputs are allowed")
	case req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64":
		return runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "encoding_format", "encoding_format must be float or base64")
	case req.Dimensions != nil && *req.Dimensions != nEmbd:
		return runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "dimensions",
			"this model's embeddings have %d dimensions", nEmbd)
	}
	return nil
}

// embeddingJobs tokenizes each input into its job, refusing the first input that is
// empty, longer than a sequence's context or over memory; total is their tokens.
func (s *Server) embeddingJobs(r *http.Request, in runnerapi.Input) ([]*job, int, *runnerapi.Error) {
	jobs, total := make([]*job, in.Len()), 0
	for i := range jobs {
		toks, herr := s.inputTokens(in, i, "input", false)
		switch {
		case herr != nil:
		case len(toks) == 0:
			herr = runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "input", "input %d is empty", i)
		case len(toks) > s.nCtxSeq:
			herr = runnerapi.ContextExceeded(len(toks), s.nCtxSeq)
			herr.Param = "input"
		default:
			herr = s.guard(len(toks))
		}
		if herr != nil {
			return nil, 0, herr
		}
		total += len(toks)
		jobs[i] = newJob(r.Context(), toks, runnerapi.Options{}, true)
		// The slot keeps an input's tokens: a chat of another partition must not
		// reuse them.
		jobs[i].partition = r.Header.Get(runnerapi.HeaderCachePartition)
	}
	return jobs, total, nil
}

// awaitEmbedding waits for j's embedding; false when the job failed (its error is
// written) or the client went away.
func awaitEmbedding(w http.ResponseWriter, r *http.Request, j *job) ([]float32, bool) {
	for {
		u := j.take()
		if u.done {
			if u.err != nil {
				writeError(w, u.err)
				return nil, false
			}
			break
		}
		select {
		case <-j.notify:
		case <-r.Context().Done():
			return nil, false
		}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.embedding, true
}

// encodeEmbedding is vec as the request's encoding_format asks: floats, or base64 of
// their little-endian bytes.
func encodeEmbedding(vec []float32, format string) any {
	if format != "base64" {
		return vec
	}
	b := make([]byte, 4*len(vec))
	for k, v := range vec {
		binary.LittleEndian.PutUint32(b[4*k:], math.Float32bits(v))
	}
	return base64.StdEncoding.EncodeToString(b)
}
