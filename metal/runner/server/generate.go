//go:build cgo && !race

package server

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat"
	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
	"github.com/macfleet/macfleet/metal/runner/llama"
)

// generator answers the requests that run the model (chat, completions, embeddings,
// tokenize): it renders and tokenizes a request, looks its prompt up in the prompt
// cache, passes the memory guard, queues its jobs on the engines, writes the response
// and records its spans. It keeps the generations in progress by request id (/cancel).
type generator struct {
	run      *runState    // the gate: the engines once ready
	mem      *memGuard    // refuses a prefill over the ceiling
	cache    *cacheStore  // the prompt's cached state, if any
	tracer   trace.Tracer // nil: tracing off
	names    modelNames
	requests requestTable
	// m is the loaded model, set once by load before the state becomes ready.
	m *loadedModel
}

// modelNames name the model in responses: the alias when set, else the request's
// model, else defaultID (the file's name).
type modelNames struct {
	alias, defaultID string
}

// loadedModel is what the requests read of the loaded model: set once by load.
type loadedModel struct {
	model   *llama.Model
	info    runnerapi.ModelInfo
	chat    *chatRenderer
	nCtxSeq int // the context of one slot
}

// of is the model's name in a response to a request for requested.
func (n modelNames) of(requested string) string {
	if n.alias != "" {
		return n.alias
	}
	if requested != "" {
		return requested
	}
	return n.defaultID
}

// readReady is the preamble of every endpoint that needs the loaded model (chat,
// completions, embeddings, tokenize): the ready engine, then req strictly decoded from
// the body, answering the first error. On failure it has written the error and
// returns nil.
func (g *generator) readReady(w http.ResponseWriter, r *http.Request, req any) *engineSet {
	eng, herr := g.run.engine()
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
func (g *generator) readGeneration(w http.ResponseWriter, r *http.Request, req generationRequest) (*engineSet, runnerapi.Options) {
	eng := g.readReady(w, r, req)
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

func (g *generator) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.TokenizeRequest
	if g.readReady(w, r, &req) == nil {
		return
	}
	addSpecial := req.AddSpecial == nil || *req.AddSpecial
	var text string
	var images [][]byte
	parseSpecial := false
	switch {
	case (req.Content != nil && req.Messages != nil) || (req.Chat != nil && (req.Content != nil || req.Messages != nil)):
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "content", "give one of content, messages and chat"))
		return
	case req.Content != nil:
		text = *req.Content
	case req.Messages != nil:
		prompt, ims, herr := g.m.chat.renderImages(&runnerapi.ChatRequest{Messages: req.Messages})
		if herr != nil {
			writeError(w, herr)
			return
		}
		text, parseSpecial, images = prompt, true, ims
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
		prompt, ims, herr := g.m.chat.renderImages(&chatReq)
		if herr != nil {
			writeError(w, herr)
			return
		}
		text, parseSpecial, images = prompt, true, ims
	default:
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "content", "content or messages is required"))
		return
	}
	if len(images) > 0 {
		toks, _, herr := g.m.chat.imagePrompt(text, images)
		if herr != nil {
			writeError(w, herr)
			return
		}
		writeJSON(w, http.StatusOK, runnerapi.TokenizeResponse{Tokens: toks, Count: len(toks)})
		return
	}
	toks, err := g.m.model.Tokenize(text, addSpecial, parseSpecial)
	if err != nil {
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "content", "tokenizing: %v", err))
		return
	}
	writeJSON(w, http.StatusOK, runnerapi.TokenizeResponse{Tokens: toks, Count: len(toks)})
}

func (g *generator) handleCompletion(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.CompletionRequest
	eng, opts := g.readGeneration(w, r, &req)
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
	toks, herr := g.inputTokens(*req.Prompt, 0, "prompt", true)
	if herr != nil {
		writeError(w, herr)
		return
	}
	text := ""
	if req.Prompt.Texts != nil {
		text = req.Prompt.Texts[0]
	}
	g.generate(w, r, eng, nil, g.names.of(req.Model), text, toks, nil, opts, nil)
}

// inputTokens tokenizes input i of in (text gets BOS; token ids are checked).
func (g *generator) inputTokens(in runnerapi.Input, i int, param string, parseSpecial bool) ([]int32, *runnerapi.Error) {
	if in.Texts != nil {
		toks, err := g.m.model.Tokenize(in.Texts[i], true, parseSpecial)
		if err != nil {
			return nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param, "tokenizing: %v", err)
		}
		return toks, nil
	}
	toks := in.Tokens[i]
	n := int32(g.m.info.NVocab)
	for _, t := range toks {
		if t < 0 || t >= n {
			return nil, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param, "token id %d is outside the vocabulary (0..%d)", t, n-1)
		}
	}
	return toks, nil
}

// generate runs a chat (co set) or text completion job and writes its response.
// text is the prompt's text when it was tokenized from one ("" for token ids); held
// are a continued answer's last tokens whose text its client never got, which the
// output starts with (continuedAnswer).
func (g *generator) generate(w http.ResponseWriter, r *http.Request, eng *engineSet, co *chat.Options, model string,
	text string, toks []int32, images []promptImage, opts runnerapi.Options, held []int32) {
	isChat := co != nil
	param := "prompt"
	if isChat {
		param = "messages"
	}
	if len(toks) == 0 {
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, param, "the prompt is empty"))
		return
	}
	restore, lookup := (*restoreState)(nil), lookupSpan{}
	partition := cachePartition(r.Header.Get(runnerapi.HeaderCachePartition), opts.CacheSalt)
	digests := promptcache.ParseDigests(r.Header.Get(runnerapi.HeaderPrefixDigests))
	if len(images) > 0 {
		// The prompt's text does not spell its tokens (no realigning them), and the
		// gateway's prefix digests do not cover the images (no peer export under them).
		text, digests = "", nil
	}
	if len(toks) < g.m.nCtxSeq && !opts.Spent { // a spent answer prefills nothing
		lookup.start = time.Now()
		restore, toks = g.cache.lookup(text, toks, partition)
		lookup.end, lookup.restore = time.Now(), restore
	}
	if len(toks) >= g.m.nCtxSeq {
		writeError(w, runnerapi.ContextExceeded(len(toks), g.m.nCtxSeq))
		return
	}
	if herr := g.mem.guard(len(toks)); herr != nil {
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
		tokenIDs:   r.Header.Get(runnerapi.HeaderTokenIDs) == runnerapi.TokenCountComments,
		usageFirst: opts.Stream && opts.IncludeUsage && r.Header.Get(runnerapi.HeaderPromptUsage) == "first-chunk",
		logprobs:   opts.Logprobs, notify: make(chan struct{}, 1)}
	spec, predicted := speculationOf(r, g.m.model, opts)
	for i := range opts.N {
		o := opts
		o.Seed += uint32(i) // each choice its own reproducible sequence
		j := newJob(r.Context(), toks, o, false)
		j.notify, j.partition, j.digests, j.images, j.predicted, j.noSpec, j.forceSpec = out.notify, partition, digests, images, predicted,
			spec == runnerapi.SpeculationOff, spec == runnerapi.SpeculationOn
		if i == 0 {
			j.restore, j.held = restore, held
		}
		if isChat && (co.Tools || co.Thinking) {
			j.special = g.m.chat.markers
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
		defer g.requests.add(id, out.choices)()
	}
	for _, c := range out.choices {
		if opts.Spent {
			spend(g.m.model, c.j) // nothing left of max_tokens to generate
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
	g.traceJob(r.Context(), lookup, out.choices[0].j)
}

// speculationOf is how request r with options opts speculates on model m: its
// runnerapi.HeaderSpeculation (off, on, or "" where the engine's step times decide),
// and the tokens of its prediction to draft from (none when off, or when the
// tokenizer refuses the prediction: it only drafts).
func speculationOf(r *http.Request, m *llama.Model, opts runnerapi.Options) (spec string, predicted []int32) {
	spec = runnerapi.SpeculationMode(r.Header.Get(runnerapi.HeaderSpeculation))
	if opts.Predicted != "" && spec != runnerapi.SpeculationOff {
		predicted, _ = m.Tokenize(opts.Predicted, false, false)
	}
	return spec, predicted
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

func (g *generator) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.EmbeddingRequest
	eng := g.readReady(w, r, &req)
	if eng == nil {
		return
	}
	if herr := embeddingProblem(req, g.m.info.NEmbd); herr != nil {
		writeError(w, herr)
		return
	}
	jobs, total, herr := g.embeddingJobs(r, *req.Input)
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
	resp := runnerapi.EmbeddingResponse{Object: "list", Model: g.names.of(req.Model),
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
func (g *generator) embeddingJobs(r *http.Request, in runnerapi.Input) ([]*job, int, *runnerapi.Error) {
	jobs, total := make([]*job, in.Len()), 0
	for i := range jobs {
		toks, herr := g.inputTokens(in, i, "input", false)
		switch {
		case herr != nil:
		case len(toks) == 0:
			herr = runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "input", "input %d is empty", i)
		case len(toks) > g.m.nCtxSeq:
			herr = runnerapi.ContextExceeded(len(toks), g.m.nCtxSeq)
			herr.Param = "input"
		default:
			herr = g.mem.guard(len(toks))
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
