package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/internal/bytesize"
	"github.com/macfleet/macfleet/internal/chat/compat"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// Runner endpoints the agent calls.
const (
	pathChat        = "/v1/chat/completions"
	pathCompletions = "/v1/completions"
	pathEmbeddings  = "/v1/embeddings"
	pathTokenize    = "/tokenize"
	pathCancel      = "/cancel"
)

// maxEmbeddingInputs is the most inputs one embeddings request may carry (as the runner).
const maxEmbeddingInputs = 2048

// chatRoles are the message roles the runner's chat templates accept.
var chatRoles = []string{"system", "user", "assistant", "tool", "developer"}

// generation is one validated chat or text completion request.
type generation struct {
	path         string
	model        string
	body         []byte
	stream       bool
	includeUsage bool
	// tokenize is the runner /tokenize request whose count the prefill guard needs;
	// tokens, when positive, is that count already known (a prompt of token ids).
	tokenize runnerapi.TokenizeRequest
	tokens   int
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.ChatRequest
	body, ok := s.decodeRequest(w, r, &req, &req.Model)
	if !ok {
		return
	}
	if len(req.Messages) == 0 {
		writeError(w, invalid(openaierr.CodeMissingField, "messages", "messages must be a non-empty array"))
		return
	}
	for i, m := range req.Messages {
		if !slices.Contains(chatRoles, m.Role) {
			writeError(w, invalid(openaierr.CodeInvalidValue, fmt.Sprintf("messages[%d].role", i),
				"unsupported role %q (one of %s)", m.Role, strings.Join(chatRoles, ", ")))
			return
		}
	}
	opts, ok := generationOptions(w, &req)
	if !ok {
		return
	}
	if s.opts.InlineImages != nil {
		if body, ok = s.inlineImages(w, r, req.Model, body); !ok {
			return
		}
	}
	// The hints are all fields of Unsupported (internal/chat/compat's test): re-reading that
	// small struct is cheaper than the body.
	unsupported, _ := json.Marshal(req.Unsupported)
	if hints := compat.Chat.Hints(unsupported); len(hints) > 0 {
		w.Header().Set(compat.IgnoredHintsHeader, compat.HeaderValue(hints))
	}
	// The runner renders the whole request (tools, template variables) to count it.
	s.generate(w, r, generation{path: pathChat, model: req.Model, body: body, stream: opts.Stream,
		includeUsage: opts.IncludeUsage, tokenize: runnerapi.TokenizeRequest{Chat: body}})
}

func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.CompletionRequest
	body, ok := s.decodeRequest(w, r, &req, &req.Model)
	if !ok {
		return
	}
	switch {
	case req.Prompt == nil:
		writeError(w, invalid(openaierr.CodeMissingField, "prompt", "prompt is required"))
		return
	case req.Prompt.Len() != 1:
		writeError(w, invalid(openaierr.CodeInvalidValue, "prompt", "prompt must be one string or one array of token ids, got %d prompts", req.Prompt.Len()))
		return
	case req.Echo:
		writeError(w, invalid(openaierr.CodeInvalidValue, "echo", "echo is not supported"))
		return
	}
	opts, ok := generationOptions(w, &req)
	if !ok {
		return
	}
	g := generation{path: pathCompletions, model: req.Model, body: body, stream: opts.Stream,
		includeUsage: opts.IncludeUsage}
	if req.Prompt.Texts != nil {
		g.tokenize.Content = &req.Prompt.Texts[0]
	} else if g.tokens = len(req.Prompt.Tokens[0]); g.tokens == 0 {
		writeError(w, invalid(openaierr.CodeInvalidValue, "prompt", "the prompt is empty"))
		return
	}
	s.generate(w, r, g)
}

// generationRequest is a chat or text completion request: api/runnerapi gives both
// their sampling options and their checks of the fields beyond sampling.
type generationRequest interface {
	Options() (runnerapi.Options, *runnerapi.Error)
	Check() *runnerapi.Error
}

// generationOptions is the last check the chat and completion endpoints share before
// they route, after their own checks of their fields: req's options, then its
// checks. On failure it has written the error and returns false.
func generationOptions(w http.ResponseWriter, req generationRequest) (runnerapi.Options, bool) {
	opts, e := req.Options()
	if e == nil {
		e = req.Check()
	}
	if e != nil {
		writeError(w, fromRunnerAPI(e))
		return opts, false
	}
	return opts, true
}

func (s *Server) handleEmbeddings(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.EmbeddingRequest
	body, ok := s.decodeRequest(w, r, &req, &req.Model)
	if !ok {
		return
	}
	switch {
	case req.Input == nil || req.Input.Len() == 0:
		writeError(w, invalid(openaierr.CodeMissingField, "input", "input is required (a string, an array of strings or token ids)"))
		return
	case req.Input.Len() > maxEmbeddingInputs:
		writeError(w, invalid(openaierr.CodeInvalidValue, "input", "at most %d inputs are allowed, got %d", maxEmbeddingInputs, req.Input.Len()))
		return
	case req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64":
		writeError(w, invalid(openaierr.CodeInvalidValue, "encoding_format", "encoding_format must be float or base64, got %q", req.EncodingFormat))
		return
	}
	// The guard sizes the batch as one prompt of every input's tokens: the runner
	// may hold them all in its slots at once.
	g := generation{path: pathEmbeddings, model: req.Model, body: body}
	if req.Input.Texts != nil {
		joined := strings.Join(req.Input.Texts, "\n")
		g.tokenize.Content = &joined
	} else {
		for _, t := range req.Input.Tokens {
			g.tokens += len(t)
		}
	}
	s.generate(w, r, g)
}

// admit lets a request in: it resolves the model's pool entry, leases its engine
// (loading it if need be) and, for a generation g (nil: none), runs the prefill guard
// before any byte of the response. The usage of a caller that is not an admin counts
// under the entry's deployment: the fleet token is the gateway's (and the
// manager's), and the gateway counts its own callers, so a sum over the gateways and
// the agents counts every answer once. On failure it has written the error (or the
// client went away) and returns a nil lease; otherwise the caller releases the lease.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, model string, g *generation) (*enginepool.Lease, enginepool.Runner) {
	ctx := r.Context()
	info := requestInfo(ctx)
	entry := model
	if s.opts.ResolveModel != nil {
		var err error
		if entry, err = s.opts.ResolveModel(r, model); err != nil {
			writeError(w, fromPool(err))
			return nil, nil
		}
	}
	if id, ok := tenancy.IdentityFrom(ctx); ok && !id.Admin {
		info.caller, info.deployment = &id, entry
		if s.opts.DeploymentOf != nil {
			info.deployment = s.opts.DeploymentOf(entry)
		}
	}
	if c, _ := ctx.Value(callerKey{}).(caller); c.reportsQueues {
		s.queues.observe(r, entry, time.Now())
	}
	lctx, span := s.spans.Start(ctx, "agent.lease", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("macfleet.entry", entry)))
	lease, err := s.pool.Acquire(lctx, entry)
	if err != nil {
		endSpan(span, err)
		info.model = s.canonicalName(entry)
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil, nil // the client went away while the model loaded
		}
		writeError(w, fromPool(err))
		return nil, nil
	}
	span.SetAttributes(attribute.Bool("macfleet.cold_start", lease.ColdStart()))
	span.End()
	info.model = lease.Model()
	rn, err := lease.Runner()
	if err != nil {
		lease.Release()
		writeError(w, fromPool(err))
		return nil, nil
	}
	if g == nil {
		return lease, rn
	}
	// The prefill guard: the prompt's token count (asked of the runner unless g
	// knows it) against the pool's CheckPrefill.
	gctx, span := s.spans.Start(ctx, "agent.prefill_guard", trace.WithSpanKind(trace.SpanKindInternal))
	n := g.tokens
	if n == 0 {
		var out runnerapi.TokenizeResponse
		if err := callRunner(gctx, rn, pathTokenize, g.tokenize, &out); err != nil {
			endSpan(span, err)
			s.writeUpstreamError(w, r, lease, rn, err)
			lease.Release()
			return nil, nil
		}
		n = out.Count
	}
	span.SetAttributes(attribute.Int("macfleet.prompt_tokens", n))
	if err := s.pool.CheckPrefill(lease.Model(), n); err != nil {
		endSpan(span, err)
		writeError(w, fromPool(err))
		lease.Release()
		return nil, nil
	}
	span.End()
	return lease, rn
}

// handleChatTokens counts the prompt of a chat completion request as the runner
// renders it (template, tools, template variables): {"prompt_tokens": N}. It serves
// Anthropic's POST /v1/messages/count_tokens through the translator.
func (s *Server) handleChatTokens(w http.ResponseWriter, r *http.Request) {
	var req runnerapi.ChatRequest
	body, ok := s.decodeRequest(w, r, &req, &req.Model)
	if !ok {
		return
	}
	e := req.Check()
	if e == nil && len(req.Messages) == 0 {
		e = runnerapi.InvalidRequest(openaierr.CodeMissingField, "messages", "messages must be a non-empty array")
	}
	if e != nil {
		writeError(w, fromRunnerAPI(e))
		return
	}
	if s.opts.InlineImages != nil {
		if body, ok = s.inlineImages(w, r, req.Model, body); !ok {
			return
		}
	}
	lease, rn := s.admit(w, r, req.Model, nil)
	if lease == nil {
		return
	}
	defer lease.Release()
	var out runnerapi.TokenizeResponse
	if err := callRunner(r.Context(), rn, pathTokenize, runnerapi.TokenizeRequest{Chat: body}, &out); err != nil {
		s.writeUpstreamError(w, r, lease, rn, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"prompt_tokens": out.Count})
}

// generate routes a validated request: admit (lease, prefill guard) → proxy. The
// lease is held from here until proxy has written the last byte and returned.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, g generation) {
	lease, rn := s.admit(w, r, g.model, &g)
	if lease == nil {
		return
	}
	defer lease.Release()
	served := lease.Model()
	body := g.body
	stripUsage := false
	if g.stream && !g.includeUsage {
		// Ask for the usage chunk anyway (it counts the generated tokens for the
		// metrics) and drop it from what the client sees.
		if b, err := withUsage(body); err == nil {
			body, stripUsage = b, true
		}
	}
	if v := r.Header.Get(runnerapi.HeaderPeerState); v != "" && g.path != pathEmbeddings {
		s.peerRestore(w, r, rn, served, v)
	}
	s.proxy(w, r, lease, rn, proxyRequest{path: g.path, body: body, stream: g.stream, stripUsage: stripUsage,
		requested: g.model, served: served, generates: g.path != pathEmbeddings,
		promptUsage: g.stream && g.includeUsage && r.Header.Get(runnerapi.HeaderPromptUsage) == "first-chunk"})
}

// canonicalName resolves a name or alias to the served name for metric labels;
// unknown names give "" so clients cannot grow the label set.
func (s *Server) canonicalName(name string) string {
	for _, m := range s.pool.Snapshot().Models {
		if m.Name == name || slices.Contains(m.Aliases, name) {
			return m.Name
		}
	}
	return ""
}

// modelObject is one entry of GET /v1/models.
type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (s *Server) modelObject(id string) modelObject {
	return modelObject{ID: id, Object: "model", Created: s.started.Unix(), OwnedBy: "macfleet"}
}

func (s *Server) handleListModels(w http.ResponseWriter, r *http.Request) {
	if s.opts.ListModels != nil {
		ids := s.opts.ListModels(r)
		data := make([]modelObject, 0, len(ids))
		for _, id := range ids {
			data = append(data, s.modelObject(id))
		}
		writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
		return
	}
	snap := s.pool.Snapshot()
	data := make([]modelObject, 0, len(snap.Models))
	for _, m := range snap.Models {
		data = append(data, s.modelObject(m.Name))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (s *Server) handleGetModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	known := s.canonicalName(id) != ""
	if s.opts.ListModels != nil {
		known = slices.Contains(s.opts.ListModels(r), id)
	}
	if !known {
		writeError(w, fromPool(&enginepool.UnknownModelError{Model: id}))
		return
	}
	writeJSON(w, http.StatusOK, s.modelObject(id))
}

// decodeRequest reads the body, up to the configured limit, into req and checks that
// it names a model (model points at req's model field; nil: req has none). On failure
// it has written the OpenAI error and returns false.
func (s *Server) decodeRequest(w http.ResponseWriter, r *http.Request, req any, model *string) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, &apiError{Status: http.StatusRequestEntityTooLarge, Type: openaierr.TypeInvalidRequest,
				Code:    openaierr.CodeRequestTooLarge,
				Message: fmt.Sprintf("the request body exceeds the node agent's limit of %s", bytesize.Format(mbe.Limit))})
			return nil, false
		}
		writeError(w, invalid(openaierr.CodeInvalidJSON, "", "reading the request body: %v", err))
		return nil, false
	}
	if e := runnerapi.DecodeJSON(body, req); e != nil {
		writeError(w, fromRunnerAPI(e))
		return nil, false
	}
	if model != nil && *model == "" {
		writeError(w, invalid(openaierr.CodeMissingField, "model", "model is required"))
		return nil, false
	}
	return body, true
}
