// Package runnerapi holds the runner's wire types: the private protocol between the node
// agent and a macfleet-runner process (docs/runner-protocol.md) and the OpenAI request
// and response shapes the runner serves, with the parsing and validation of requests.
// It is pure Go so the agent, tests and benchmarks can share it.
package runnerapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// ListeningEvent is the single JSON line the runner prints to stdout once it listens.
type ListeningEvent struct {
	Event  string `json:"event"` // "listening"
	Addr   string `json:"addr,omitempty"`
	Socket string `json:"socket,omitempty"`
	PID    int    `json:"pid"`
}

// EmbedChunk bounds the tokens of an embedding input the runner decodes per slot
// and step: every one of them is an output row, and llama.cpp sizes its output
// buffer (logits included) by the largest number of output rows it has seen. The
// memory estimate sizes that buffer from it.
const EmbedChunk = 64

// Runner states reported by /health and /status.
const (
	StateLoading  = "loading"
	StateReady    = "ready"
	StateFailed   = "failed"
	StateStopping = "stopping"
)

// Health is the body of GET /health.
type Health struct {
	Status   string  `json:"status"`
	Progress float64 `json:"progress"`
	Error    string  `json:"error,omitempty"`
	// Nonce echoes --nonce: an agent adopting a runner it did not start checks it, so
	// a stale socket or a recycled pid is never taken for the runner it recorded.
	Nonce string `json:"nonce,omitempty"`
}

// ModelInfo describes the loaded model in /status.
type ModelInfo struct {
	Path         string `json:"path"`
	SizeBytes    int64  `json:"size_bytes"`
	NCtxTrain    int    `json:"n_ctx_train"`
	NEmbd        int    `json:"n_embd"`
	NLayer       int    `json:"n_layer"`
	NHead        int    `json:"n_head"`
	NHeadKV      int    `json:"n_head_kv"`
	NVocab       int    `json:"n_vocab"`
	KVType       string `json:"kv_type"`
	ChatTemplate bool   `json:"chat_template"`
	// KVBytesPerToken is the KV cache size of one token (all layers, keys and values).
	KVBytesPerToken int64 `json:"kv_bytes_per_token"`
}

// Renderers of chat prompts.
const (
	// RendererJinja renders with the model's own Jinja chat template.
	RendererJinja = "jinja"
	// RendererBuiltin is llama.cpp's built-in template guesser: for models without a
	// template, or whose template does not parse.
	RendererBuiltin = "llama.cpp-builtin"
)

// ChatInfo describes a model's chat rendering.
type ChatInfo struct {
	// Renderer is RendererJinja or RendererBuiltin.
	Renderer string `json:"renderer"`
	// ToolFormat is the tool-call syntax parsed from the output ("none" without
	// tools support).
	ToolFormat string `json:"tool_format"`
	// Tools reports that the template renders tools.
	Tools bool `json:"tools"`
	// Thinking reports that <think> reasoning is split from the content.
	Thinking bool `json:"thinking"`
	// TemplateError is why the model's own template is not used, if it is not.
	TemplateError string `json:"template_error,omitempty"`
	// Vision reports that a projector (--mmproj) is loaded: user messages may carry
	// image parts.
	Vision bool `json:"vision,omitempty"`
}

// Accelerator is one GPU a runner's engine computes with.
type Accelerator struct {
	// Name is the engine's name of the device (CUDA0, Metal …), Description the
	// hardware's (the card's or the chip's).
	Name        string `json:"name"`
	Description string `json:"description"`
	// TotalBytes and FreeBytes are the device's memory as its driver reports it, every
	// process together.
	TotalBytes int64 `json:"total_bytes"`
	FreeBytes  int64 `json:"free_bytes"`
}

// Status is the body of GET /status.
type Status struct {
	State          string `json:"state"`
	PID            int    `json:"pid"`
	FootprintBytes int64  `json:"footprint_bytes"`
	// MetalAllocatedBytes is what the GPU devices report in use: on a Mac the
	// process's Metal allocations; on a card with its own memory the whole card's use,
	// every process together (DeviceBytes is the runner's own).
	MetalAllocatedBytes int64 `json:"metal_allocated_bytes"`
	// DeviceBytes is the runner's own weights, KV cache and compute buffers on
	// accelerators (zero on the CPU). On a Mac that memory is unified and
	// FootprintBytes holds it too; on a card with its own memory it does not
	// (DeviceMemorySeparate).
	DeviceBytes int64 `json:"device_bytes,omitempty"`
	// DeviceMemorySeparate is true when the accelerators have memory of their own
	// (a discrete card), false on unified memory (a Mac).
	DeviceMemorySeparate bool `json:"device_memory_separate,omitempty"`
	// Accelerators are the GPUs the engine registered, compiled in (Metal) or loaded
	// from the backend directory.
	Accelerators []Accelerator `json:"accelerators,omitempty"`
	// Backends says what the runner found in its backend directory: each library loaded,
	// or why not, or that there was none.
	Backends       string     `json:"backends,omitempty"`
	KVCellsUsed    int        `json:"kv_cells_used"`
	KVCellsTotal   int        `json:"kv_cells_total"`
	SlotsTotal     int        `json:"slots_total"`
	SlotsBusy      int        `json:"slots_busy"`
	RequestsActive int        `json:"requests_active"`
	CeilingBytes   int64      `json:"ceiling_bytes"`
	Model          *ModelInfo `json:"model,omitempty"`
	// PromptCache is absent until the model is loaded, and when the runner serves the
	// model without its prompt cache (Off says why).
	PromptCache *PromptCacheStatus `json:"prompt_cache,omitempty"`
	// Off lists the paths the runner serves the loaded model without, each with its
	// reason; absent when it serves every path, and until the model is loaded.
	Off []PathOff `json:"off,omitempty"`
	// Chat is absent until the model is loaded.
	Chat *ChatInfo `json:"chat,omitempty"`
	// Draft is the draft model speculative decoding drafts with (--draft), absent
	// without one.
	Draft *DraftStatus `json:"draft,omitempty"`
	// Split lists the workers that hold some of the model's layers (docs/split-model.md),
	// absent when the runner holds them all.
	Split []SplitWorkerStatus `json:"split,omitempty"`
	// SplitHeadComputeSeconds is, for a split runner, the time its decode steps took
	// minus the time they waited on the workers' links: the runner's own layers and the
	// output layer (docs/split-model.md#metrics-and-traces).
	SplitHeadComputeSeconds float64 `json:"split_head_compute_seconds,omitempty"`
	// FillerTokens counts the filler tokens decoded so far: one for each idle slot
	// between two busy ones at a step, so that llama.cpp computes the step as one
	// micro-batch (its cell is removed after the step; docs/runner-protocol.md).
	FillerTokens int64 `json:"filler_tokens,omitempty"`
	// PaddedSteps counts the decode steps whose drafts fillers padded: every busy
	// slot's tokens made as many as the drafting slot's, so that the step stays one
	// micro-batch (docs/runner-protocol.md).
	PaddedSteps int64 `json:"padded_steps,omitempty"`
}

// SplitWorkerStatus is one split worker's link as the runner sees it.
type SplitWorkerStatus struct {
	Addr string `json:"addr"`
	// Layers is how many of the model's layers the worker computes, from FirstLayer
	// (counted from 0; the runner keeps the layers before the first worker's).
	Layers     int `json:"layers"`
	FirstLayer int `json:"first_layer"`
	// BytesSent and BytesReceived count the link's traffic (framing included);
	// RoundTrips the answered commands; Computes the graphs the worker computed.
	BytesSent     uint64 `json:"bytes_sent"`
	BytesReceived uint64 `json:"bytes_received"`
	RoundTrips    uint64 `json:"round_trips"`
	Computes      uint64 `json:"computes"`
	// LinkWaitSeconds is the time the runner spent waiting on answered commands
	// (sending, the worker's work, the answer); WorkerComputeSeconds the part of it the
	// worker spent computing graphs. The difference is what the link costs.
	LinkWaitSeconds      float64 `json:"link_wait_seconds"`
	WorkerComputeSeconds float64 `json:"worker_compute_seconds"`
	// AllocatedBytes is the worker's memory this runner's buffers take (its layers'
	// weights, their KV cache, the compute buffer): the shard's share on its Mac.
	AllocatedBytes int64 `json:"allocated_bytes"`
	// MemoryBytes is what the worker answered as its free and total memory when the
	// runner connected: its --memory (the shard's reservation on its Mac, when its
	// agent started it), else its Mac's physical memory.
	MemoryBytes int64 `json:"memory_bytes"`
	// Device is the ggml device the worker computes with, as it answered the runner's
	// greeting: the first GPU of its build (Metal on a Mac), else its CPU, or the one
	// its --device names.
	Device SplitWorkerDevice `json:"device"`
	// PeerLink says the worker pushes the hidden state after its layers straight to
	// the next worker (it was started with --next); PeerBytesSent counts those pushes'
	// bytes (framing included) as the worker reports them with each computed graph.
	// They are on the link between the two workers, not in BytesSent or BytesReceived.
	PeerLink      bool   `json:"peer_link,omitempty"`
	PeerBytesSent uint64 `json:"peer_bytes_sent,omitempty"`
	// Error is set once the link has failed (the worker died, the link was cut or
	// timed out); the runner is then failed and serves nothing.
	Error string `json:"error,omitempty"`
}

// SplitWorkerDevice is a ggml device: its type ("CPU", "GPU", "IGPU", "ACCEL") and
// its name in ggml ("CPU", "Metal").
type SplitWorkerDevice struct {
	Type string `json:"type"`
	Name string `json:"name"`
}

// Limits is the body of POST /limits.
type Limits struct {
	CeilingBytes   int64 `json:"ceiling_bytes"`
	HardLimitBytes int64 `json:"hard_limit_bytes"`
	HostUsedBytes  int64 `json:"host_used_bytes"`
}

// CacheClear is the answer to POST /cache/clear.
type CacheClear struct {
	BytesReclaimed int64 `json:"bytes_reclaimed"`
	EntriesCleared int   `json:"entries_cleared"`
	// HotEntriesCleared and HotBytesCleared are the prompt cache hot tier's share of
	// the entries, and the bytes it accounted for them.
	HotEntriesCleared int   `json:"hot_entries_cleared"`
	HotBytesCleared   int64 `json:"hot_bytes_cleared"`
}

// Abort is the answer to POST /abort.
type Abort struct {
	Aborted int `json:"aborted"`
}

// HeaderRequestID names a generation request (chat or text completion) so that it can
// be cancelled by POST /cancel. The gateway sets it on the requests it forwards; the
// node agent passes it on to the runner.
const HeaderRequestID = "X-Macfleet-Request-Id"

// Cancel is the body of POST /cancel and of the node agent's cancel request: the
// HeaderRequestID of the request to end.
type Cancel struct {
	ID string `json:"id"`
}

// Cancelled is the answer to POST /cancel. Found: the request was being answered; it
// ends as if it had met a stop condition (finish_reason "cancelled"), with its usage
// (what was generated until then) on a stream's last chunk or in the answer. Not
// found: no such request (not started yet, or already answered).
type Cancelled struct {
	Found bool `json:"found"`
}

// FinishCancelled is the finish_reason of a choice ended by POST /cancel.
const FinishCancelled = "cancelled"

// TokenizeRequest is the body of POST /tokenize: content, or messages rendered with
// the chat template (generation prompt added), or a whole chat request rendered as
// the chat endpoint renders it (tools and template variables included).
type TokenizeRequest struct {
	Content  *string         `json:"content,omitempty"`
	Messages []Message       `json:"messages,omitempty"`
	Chat     json.RawMessage `json:"chat,omitempty"`
	// AddSpecial adds BOS as the model is configured to (default true).
	AddSpecial *bool `json:"add_special,omitempty"`
}

// HeaderPromptUsage, set to "first-chunk" on a streamed chat or text completion that
// asks for usage (stream_options.include_usage), asks the runner to put the prompt's
// usage (prompt_tokens, prompt_tokens_details.cached_tokens, no completion tokens
// yet) on the first chunk too, so that a translation that must report the prompt's
// size before the first content (Anthropic's message_start) has it. The last chunk's
// usage is unchanged. The node agent passes it on from the request.
const HeaderPromptUsage = "X-Macfleet-Prompt-Usage"

// HeaderContinue, set to ContinueFinalMessage on a chat completion whose messages end
// with an assistant's partial answer, asks the runner to continue that answer: the
// chat template renders the conversation with the final message left open (no end of
// turn, no new assistant turn), and the model writes on from its last character. The
// answer's usage counts the partial answer's tokens as completion tokens, not prompt
// tokens, and max_tokens bounds the whole answer. A template that cannot leave the
// message open is a 400 chat_template_error; so is n > 1. The gateway sets it to
// continue a stream whose replica failed (docs/fleet.md, "Continuing a broken
// stream"); the node agent passes it on.
const HeaderContinue = "X-Macfleet-Continue"

// ContinueFinalMessage is the value of HeaderContinue.
const ContinueFinalMessage = "final-message"

// HeaderContinuedTokens, beside HeaderContinue, is how many tokens of the partial
// answer its client already has, as the gateway counted them (HeaderTokenCounts):
// the usage counts that many as completion tokens and max_tokens bounds the rest by
// them, instead of the runner re-tokenizing the partial answer's text (which can read
// as more tokens than were generated). A non-negative integer; the node agent passes
// it on.
const HeaderContinuedTokens = "X-Macfleet-Continued-Tokens"

// HeaderContinuedTokenIDs, beside HeaderContinue, is the partial answer's tokens as
// they were generated (FormatTokenIDs: ids separated by commas), as the gateway read
// them off the count lines (HeaderTokenIDs). A reply does not always re-tokenize into
// the tokens the model wrote, and another tokenization of the same text continues
// differently; the runner reads the answer as these tokens for as far as their text
// spells it (the rest of the text tokenized as usual), so a continuation goes on as
// the uninterrupted stream would have. A hint that cannot change the text: ids that
// do not parse, are outside the vocabulary or spell other text are not used (the
// runner logs how many it used). The gateway sends at most MaxContinuedTokenIDsBytes
// of them (the first ones); the node agent takes it only from a gateway, as
// HeaderContinue.
const HeaderContinuedTokenIDs = "X-Macfleet-Continued-Token-Ids"

// MaxContinuedTokenIDsBytes bounds HeaderContinuedTokenIDs's value, well within the
// header limits of the agent and the runner (1 MiB).
const MaxContinuedTokenIDsBytes = 256 << 10

// HeaderTokenIDs, set to TokenCountComments beside HeaderTokenCounts, asks the
// runner to put on each count line the ids of the tokens generated since the choice's
// previous count line: "%s I N IDS" (IDS as FormatTokenIDs writes them; the line has
// no IDS when there are none), the last tokens of the N. The gateway keeps them to
// continue the stream with HeaderContinuedTokenIDs. The node agent passes it on.
const HeaderTokenIDs = "X-Macfleet-Token-Ids"

// HeaderTokenCounts, set to TokenCountComments on a streamed chat completion, asks the
// runner to put before the data line of each event that carries generated output a
// comment line "%s I N" (TokenCountComment): choice I has generated N tokens so far;
// a chat completion's first event (choice 0's role chunk) has the comment line
// "%s P C" (PromptCountComment) before its data line instead: the prompt has P tokens
// (as usage's prompt_tokens), C of them found in the prompt cache. SSE clients ignore
// comments; the gateway reads them for its own count of the tokens it forwarded, and
// for the usage of a stream that broke after its end, and removes them. The node agent
// passes it on.
const HeaderTokenCounts = "X-Macfleet-Token-Counts"

// HeaderResumeStream, beside HeaderContinue on a streamed Responses or Anthropic
// Messages request, is where the client's stream stands (a ResumeStream in JSON): the
// node agent's translator goes on with that stream's ids, sequence numbers and open
// text item or block instead of starting a new one, and its text done events carry
// the final assistant message's text (what the client has) with what follows.
const HeaderResumeStream = "X-Macfleet-Resume-Stream"

// ResumeStream is the value of HeaderResumeStream.
type ResumeStream struct {
	// Responses: the response's id and created_at, the next sequence_number and the
	// open message item's id (output index 0, or 1 after a reasoning item; "" when
	// none is open yet).
	ID        string `json:"id,omitempty"`
	CreatedAt int64  `json:"created_at,omitempty"`
	Seq       int    `json:"seq,omitempty"`
	Item      string `json:"item,omitempty"`
	// Index is a Messages stream's text block's index, and Open whether the client
	// has its content_block_start.
	Index int  `json:"index,omitempty"`
	Open  bool `json:"open,omitempty"`
	// Reasoning is a Responses stream's reasoning item's id ("" when it had none): the
	// item at output index 0, its message item then at 1. ReasoningOpen: the client
	// has not had its done events (no message item yet), so the stream goes on inside
	// it. Its text is the final assistant message's reasoning, which the request
	// carries as a reasoning item right before that message.
	Reasoning     string `json:"reasoning,omitempty"`
	ReasoningOpen bool   `json:"reasoning_open,omitempty"`
}

// TokenCountComments is the value of HeaderTokenCounts; TokenCountComment starts each
// count's comment line, PromptCountComment the prompt's.
const (
	TokenCountComments = "comments"
	TokenCountComment  = ": tokens"
	PromptCountComment = ": prompt"
)

// FormatTokenIDs writes token ids as a count line and HeaderContinuedTokenIDs carry
// them: decimal, separated by commas.
func FormatTokenIDs(ids []int32) string {
	b := make([]byte, 0, len(ids)*7)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(id), 10)
	}
	return string(b)
}

// ParseTokenIDs reads what FormatTokenIDs writes; an id that is not a non-negative
// 32-bit integer is an error.
func ParseTokenIDs(s string) ([]int32, error) {
	if s == "" {
		return nil, nil
	}
	ids := make([]int32, 0, strings.Count(s, ",")+1)
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.ParseInt(f, 10, 32)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("token id %q is not a non-negative 32-bit integer", clipped(f))
		}
		ids = append(ids, int32(n))
	}
	return ids, nil
}

// clipped is s cut to 32 bytes, for an error message.
func clipped(s string) string {
	if len(s) > 32 {
		return strings.ToValidUTF8(s[:32], "") + "…"
	}
	return s
}

// HeaderCachePartition names the part of the prompt cache a request may hit and add
// to: prefixes cached in one partition are never found from another, in a slot's
// memory, the hot tier or the SSD tier. The gateway sets it from the caller's key
// (its namespace, or the key itself) and drops it from clients; absent, the request
// uses the shared partition. The request's cache_salt divides a partition further.
const HeaderCachePartition = "X-Macfleet-Cache-Partition"

// TokenizeResponse is the answer to POST /tokenize.
type TokenizeResponse struct {
	Tokens []int32 `json:"tokens"`
	Count  int     `json:"count"`
}

// Error codes used by the runner (the OpenAI "code" field).
const (
	CodeInvalidJSON           = "invalid_json"
	CodeInvalidValue          = "invalid_value"
	CodeMissingField          = "missing_required_parameter"
	CodeContextLengthExceeded = "context_length_exceeded"
	CodePrefillMemoryExceeded = "prefill_memory_exceeded"
	CodeAborted               = "aborted"
	CodeShuttingDown          = "shutting_down"
	CodeLoading               = "model_loading"
	CodeLoadFailed            = "model_load_failed"
	// CodeSplitWorkerLost: a worker holding some of the model's layers died or its link
	// failed; the runner serves nothing more (docs/split-model.md).
	CodeSplitWorkerLost  = "split_worker_lost"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeInternal         = "internal_error"
)

// Error types (the OpenAI "type" field).
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeServer         = "server_error"
	TypeUnavailable    = "service_unavailable"
)

// Error is an OpenAI-shaped error with the HTTP status it is sent with.
type Error struct {
	Status  int
	Message string
	Type    string
	Code    string
	Param   string
	// EstimatedBytes and LimitBytes accompany prefill_memory_exceeded.
	EstimatedBytes, LimitBytes int64
}

func (e *Error) Error() string { return e.Message }

// MarshalJSON renders {"error":{...}}.
func (e *Error) MarshalJSON() ([]byte, error) {
	type body struct {
		Message        string  `json:"message"`
		Type           string  `json:"type"`
		Code           string  `json:"code,omitempty"`
		Param          *string `json:"param"`
		EstimatedBytes int64   `json:"estimated_bytes,omitempty"`
		LimitBytes     int64   `json:"limit_bytes,omitempty"`
	}
	b := body{Message: e.Message, Type: e.Type, Code: e.Code, EstimatedBytes: e.EstimatedBytes, LimitBytes: e.LimitBytes}
	if e.Param != "" {
		b.Param = &e.Param
	}
	return json.Marshal(struct {
		Error body `json:"error"`
	}{b})
}

// ErrorBody is the parsed form of an error response, for clients.
type ErrorBody struct {
	Error struct {
		Message        string  `json:"message"`
		Type           string  `json:"type"`
		Code           string  `json:"code"`
		Param          *string `json:"param"`
		EstimatedBytes int64   `json:"estimated_bytes"`
		LimitBytes     int64   `json:"limit_bytes"`
	} `json:"error"`
}

// InvalidRequest is a 400 error.
func InvalidRequest(code, param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Code: code, Param: param,
		Message: fmt.Sprintf(format, args...)}
}

// Unavailable is a 503 error.
func Unavailable(code, format string, args ...any) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: code,
		Message: fmt.Sprintf(format, args...)}
}

// Internal is a 500 error.
func Internal(format string, args ...any) *Error {
	return &Error{Status: http.StatusInternalServerError, Type: TypeServer, Code: CodeInternal,
		Message: fmt.Sprintf(format, args...)}
}

// PrefillTooLarge is the 413 refusal of a prefill over the runner's ceiling.
func PrefillTooLarge(estimated, footprint, limit int64) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Type: TypeInvalidRequest, Code: CodePrefillMemoryExceeded,
		EstimatedBytes: estimated, LimitBytes: limit,
		Message: fmt.Sprintf("prefill needs about %d bytes on top of the runner's %d; its ceiling is %d bytes",
			estimated, footprint, limit)}
}

// ContextExceeded is the 400 refusal of a prompt longer than a slot's context.
func ContextExceeded(promptTokens, slotCtx int) *Error {
	return &Error{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Code: CodeContextLengthExceeded,
		Param: "messages",
		Message: fmt.Sprintf("this model's context is %d tokens per request; the prompt has %d tokens",
			slotCtx, promptTokens)}
}
