package compat

import "strings"

// Chat is the policy of POST /v1/chat/completions.
var Chat = Policy{API: "OpenAI Chat Completions", Endpoint: "/v1/chat/completions", Fields: []Field{
	{Name: "model", Treatment: Honoured, Does: "routes to the deployment (name or alias)"},
	{Name: "messages", Treatment: Honoured, Does: "rendered with the model's chat template; text parts, and image_url parts in user messages for a deployment with a projector (spec.model.projector; a data: URI, or an https URL the fleet fetches under the SourcePolicy); audio and file parts are a 400 (docs/vision.md)"},
	{Name: "max_tokens", Treatment: Honoured, Does: "caps the completion"},
	{Name: "max_completion_tokens", Treatment: Honoured, Does: "caps the completion (wins over max_tokens)"},
	{Name: "temperature", Treatment: Honoured, Does: "sampling"},
	{Name: "top_p", Treatment: Honoured, Does: "sampling"},
	{Name: "top_k", Treatment: Honoured, Does: "sampling (an extension)"},
	{Name: "min_p", Treatment: Honoured, Does: "sampling (an extension)"},
	{Name: "seed", Treatment: Honoured, Does: "reproducible sampling; choice i is seeded seed + i"},
	{Name: "stop", Treatment: Honoured, Does: "up to 16 stop strings; the one that matched comes back as choices[].stop_sequence"},
	{Name: "presence_penalty", Treatment: Honoured, Does: "sampling"},
	{Name: "frequency_penalty", Treatment: Honoured, Does: "sampling"},
	{Name: "n", Treatment: Honoured, Does: "each choice its own sequence, up to the model's parallel slots"},
	{Name: "stream", Treatment: Honoured, Does: "server-sent events"},
	{Name: "stream_options", Treatment: Honoured, Does: "include_usage: a last chunk with usage; include_obfuscation: a hint (events are not padded)"},
	{Name: "logprobs", Treatment: Honoured, Does: "per-token log-probabilities"},
	{Name: "top_logprobs", Treatment: Honoured, Does: "up to 20 alternatives per token"},
	{Name: "tools", Treatment: Honoured, Does: "function tools, rendered by the template"},
	{Name: "tool_choice", Treatment: Honoured, Does: "auto, none; required and a named function are enforced by grammar"},
	{Name: "parallel_tool_calls", Treatment: Honoured, Does: "false: at most one call"},
	{Name: "response_format", Treatment: Honoured, Does: "text, json_object, json_schema, enforced by grammar"},
	{Name: "reasoning_effort", Treatment: Honoured, Does: "passed to the chat template"},
	{Name: "chat_template_kwargs", Treatment: Honoured, Does: "variables for the chat template (an extension), e.g. enable_thinking"},
	{Name: "prompt_cache_key", Treatment: Honoured, Does: "the gateway's prefix-affinity key: requests with the same key go to the same replica (with `--routing=prefix-affinity`, and with `prefix-cache` when no replica holds the conversation yet)"},
	{Name: "cache_salt", Treatment: Honoured, Does: "divides the prompt cache (an extension): only requests with the same salt, and of the same team, share cached prefixes"},
	{Name: "store", Treatment: Hint, Does: "nothing is stored", Neutral: []string{"false"}},
	{Name: "metadata", Treatment: Hint, Does: "accepted, not stored"},
	{Name: "user", Treatment: Hint, Does: "accepted, no effect"},
	{Name: "safety_identifier", Treatment: Hint, Does: "accepted, no effect"},
	{Name: "service_tier", Treatment: Hint, Does: "every request is served alike", Neutral: []string{`"auto"`, `"default"`}},
	{Name: "verbosity", Treatment: Hint, Does: "not passed to the model", Neutral: []string{`"medium"`}},
	{Name: "prompt_cache_retention", Treatment: Hint, Does: "prefixes are kept as the fleet's prompt cache allows"},
	{Name: "logit_bias", Treatment: Refused, Does: "400 unless empty"},
	{Name: "audio", Treatment: Refused, Does: "audio output: the models served are text-only"},
	{Name: "modalities", Treatment: Refused, Does: "400 unless [\"text\"]"},
	{Name: "prediction", Treatment: Honoured, Does: "speculative decoding drafts from its content (a string or text parts); the answer is the model's own, token for token, only faster where it repeats the prediction (docs/speculative-decoding.md)"},
	{Name: "web_search_options", Treatment: Refused, Does: "web search is not served (the answer would lack it)"},
	{Name: "functions", Treatment: Refused, Does: "deprecated: send tools"},
	{Name: "function_call", Treatment: Refused, Does: "deprecated: send tool_choice"},
}}

// Responses is the policy of POST /v1/responses.
var Responses = Policy{API: "OpenAI Responses", Endpoint: "/v1/responses", Fields: []Field{
	{Name: "model", Treatment: Honoured, Does: "routes to the deployment"},
	{Name: "input", Treatment: Honoured, Does: "a string or message, function_call, function_call_output, custom_tool_call and custom_tool_call_output items; past reasoning items are dropped; input_image parts (image_url: a data: URI or an https URL) in user messages for a deployment with a projector (docs/vision.md); file_id and input_file are a 400"},
	{Name: "instructions", Treatment: Honoured, Does: "the system prompt"},
	{Name: "tools", Treatment: Honoured, Does: "function tools; custom (freeform) tools as below; namespace tools flattened into functions; hosted tools as below"},
	{Name: "tools[].type=namespace", Treatment: Honoured, Does: "its functions are offered to the model; a call comes back with its namespace"},
	{Name: "tools[].defer_loading", Treatment: Hint, Does: "the function is shown to the model at once (there is no hosted tool_search): named in the header unless false; on a namespace or its functions alike", Neutral: []string{"false"}},
	{Name: "tools[].type=" + strings.Join(HostedResponsesTools, "|"), Treatment: Hint, Does: "hosted tools only the vendor runs: not shown to the model, named in the header as tools[TYPE]"},
	{Name: "tools[].type=custom", Treatment: Honoured, Does: "a freeform tool: the model writes its input as one string, held to its format's grammar (lark or regex, by the runner's grammar sampler; a construct that cannot be enforced is a 400 naming it) or free (text); the call comes back as a custom_tool_call item with the raw input; async and allowed_callers are hints (the call comes back at once, to the client)"},
	{Name: "tools[].type=local_shell|shell|computer_use_preview|apply_patch", Treatment: Refused, Does: "tools whose calls only the vendor's models emit"},
	{Name: "tool_choice", Treatment: Honoured, Does: "auto, none, required, a named function or custom tool"},
	{Name: "parallel_tool_calls", Treatment: Honoured, Does: "false: at most one call"},
	{Name: "text", Treatment: Honoured, Does: "format: text, json_object, json_schema (grammar); verbosity: a hint, named in the header as text.verbosity unless medium"},
	{Name: "max_output_tokens", Treatment: Honoured, Does: "caps the answer; status incomplete when it did"},
	{Name: "temperature", Treatment: Honoured, Does: "sampling"},
	{Name: "top_p", Treatment: Honoured, Does: "sampling"},
	{Name: "seed", Treatment: Honoured, Does: "reproducible sampling (an extension)"},
	{Name: "stream", Treatment: Honoured, Does: "the Responses event stream"},
	{Name: "reasoning", Treatment: Honoured, Does: "effort: passed to the template; summary: a hint, named in the header as reasoning.summary (reasoning comes back whole as reasoning_text)"},
	{Name: "prompt_cache_key", Treatment: Honoured, Does: "the gateway's prefix-affinity key (as in chat)"},
	{Name: "store", Treatment: Hint, Does: "nothing is stored (the response says store: false)", Neutral: []string{"false"}},
	{Name: "include", Treatment: Honoured, Does: "message.output_text.logprobs: each output text token's log-probability, on the output_text deltas, the done events and the response; reasoning.encrypted_content and the hosted tools' items: nothing to include (reasoning comes back as plain reasoning_text), named in the header as include; other values are a 400"},
	{Name: "metadata", Treatment: Hint, Does: "echoed in the response, not stored"},
	{Name: "user", Treatment: Hint, Does: "accepted, no effect"},
	{Name: "safety_identifier", Treatment: Hint, Does: "accepted, no effect"},
	{Name: "client_metadata", Treatment: Hint, Does: "accepted, no effect (Codex's session ids)"},
	{Name: "service_tier", Treatment: Hint, Does: "every request is served alike", Neutral: []string{`"auto"`, `"default"`}},
	{Name: "prompt_cache_retention", Treatment: Hint, Does: "prefixes are kept as the fleet's prompt cache allows"},
	{Name: "stream_options", Treatment: Hint, Does: "include_obfuscation: events are not padded", Neutral: []string{`{"include_obfuscation":false}`}},
	{Name: "context_management", Treatment: Hint, Does: "compaction is declined: the conversation is rendered as sent"},
	{Name: "truncation", Treatment: Refused, Does: "auto: a conversation longer than the context is a 400, not truncated (disabled is accepted)"},
	{Name: "background", Treatment: Refused, Does: "true: responses run only while the request is open (false is accepted)"},
	{Name: "previous_response_id", Treatment: Refused, Does: "responses are not stored: send the whole conversation as input"},
	{Name: "conversation", Treatment: Refused, Does: "conversations are not stored: send the whole conversation as input"},
	{Name: "prompt", Treatment: Refused, Does: "stored prompt templates are not served"},
	{Name: "max_tool_calls", Treatment: Refused, Does: "the bound is not enforced"},
	{Name: "top_logprobs", Treatment: Honoured, Does: "up to 20 alternatives per output text token (above 0, the logprobs come without include)"},
}}

// HostedResponsesTools are the Responses tool types only the vendor can run: dropped
// from what the model sees and reported.
var HostedResponsesTools = []string{"web_search", "web_search_preview", "web_search_2025_08_26",
	"web_search_preview_2025_03_11", "file_search", "code_interpreter", "image_generation", "mcp"}

// Messages is the policy of POST /v1/messages (and /v1/messages/count_tokens).
var Messages = Policy{API: "Anthropic Messages", Endpoint: "/v1/messages", Fields: []Field{
	{Name: "model", Treatment: Honoured, Does: "routes to the deployment"},
	{Name: "max_tokens", Treatment: Honoured, Does: "required; caps the answer (stop_reason max_tokens)"},
	{Name: "messages", Treatment: Honoured, Does: "text, tool_use, tool_result and thinking blocks; image blocks (base64 or url source) in user messages for a deployment with a projector (docs/vision.md); document blocks, file sources and images in tool results are a 400"},
	{Name: "messages[].role=system", Treatment: Honoured, Does: "folded into the system prompt, in order"},
	{Name: "system", Treatment: Honoured, Does: "the system prompt (a string or text blocks)"},
	{Name: "stop_sequences", Treatment: Honoured, Does: "stop strings; the matched one comes back as stop_sequence"},
	{Name: "temperature", Treatment: Honoured, Does: "sampling (0 to 1)"},
	{Name: "top_p", Treatment: Honoured, Does: "sampling"},
	{Name: "top_k", Treatment: Honoured, Does: "sampling"},
	{Name: "stream", Treatment: Honoured, Does: "the Messages event stream; message_start carries the prompt's input_tokens"},
	{Name: "tools", Treatment: Honoured, Does: "client tools (input_schema); server tools as below"},
	{Name: "tools[].type=custom", Treatment: Honoured, Does: "a client tool (type may be left out)"},
	{Name: "tools[].name", Treatment: Honoured, Does: "the function's name"},
	{Name: "tools[].description", Treatment: Honoured, Does: "the function's description"},
	{Name: "tools[].input_schema", Treatment: Honoured, Does: "the function's parameters; enforced by grammar when the call is forced"},
	{Name: "tools[].strict", Treatment: Honoured, Does: "true: the input is enforced by grammar, as chat's function.strict (with auto, once the model opens a call; a 400 for models whose call format takes no grammar)"},
	{Name: "tools[].input_examples", Treatment: Honoured, Does: "rendered into the description the model sees, one JSON object a line after \"Example inputs:\""},
	{Name: "tools[].cache_control", Treatment: Hint, Does: "named in the header as cache_control (below)"},
	{Name: "tools[].defer_loading", Treatment: Hint, Does: "the tool is shown to the model at once (there is no tool search): named in the header unless false", Neutral: []string{"false"}},
	{Name: "tools[].eager_input_streaming", Treatment: Hint, Does: "a call's input is streamed whole once the call is complete: named in the header unless false", Neutral: []string{"false"}},
	{Name: "tools[].allowed_callers", Treatment: Hint, Does: "only direct calls are served: named in the header unless [\"direct\"]; a tool that leaves direct out (only code execution may call it) is not shown to the model", Neutral: []string{`["direct"]`}},
	{Name: "tools[].type=" + strings.Join(HostedAnthropicTools, "…|") + "…", Treatment: Hint, Does: "server tools only the vendor runs: not shown to the model (their other fields are not read), named in the header as tools[TYPE]"},
	{Name: "tools[].type=bash_…|text_editor_…|computer_…|memory_…", Treatment: Refused, Does: "Anthropic-defined client tools whose schema only the vendor's models know"},
	{Name: "tool_choice", Treatment: Honoured, Does: "auto, any (required), tool (named), none, disable_parallel_tool_use"},
	{Name: "thinking", Treatment: Honoured, Does: "enabled, adaptive → the template's enable_thinking true (budget_tokens → reasoning_effort), disabled → false"},
	{Name: "thinking.type", Treatment: Honoured, Does: "enabled, adaptive, disabled (any other value is a 400)"},
	{Name: "thinking.budget_tokens", Treatment: Honoured, Does: "reasoning_effort low below 4096, medium below 16384, else high"},
	{Name: "thinking.display", Treatment: Hint, Does: "summarized, omitted: thinking comes back whole either way (only its presentation differs), named in the header; any other value is a 400"},
	{Name: "output_config", Treatment: Honoured, Does: "effort → reasoning_effort; format json_schema → enforced by grammar"},
	{Name: "metadata", Treatment: Hint, Does: "user_id: accepted, no effect"},
	{Name: "service_tier", Treatment: Hint, Does: "every request is served alike", Neutral: []string{`"auto"`, `"standard_only"`}},
	{Name: "context_management", Treatment: Hint, Does: "edits are declined: the conversation is rendered as sent"},
	{Name: "cache_control", Treatment: Hint, Does: "on system, message blocks and tools: every prompt prefix is cached anyway"},
	{Name: "container", Treatment: Refused, Does: "code-execution containers are not served"},
	{Name: "mcp_servers", Treatment: Refused, Does: "remote MCP servers are not called"},
}}

// HostedAnthropicTools are the prefixes of Anthropic server tool types (web search,
// web fetch, code execution, tool search): dropped from what the model sees and
// reported.
var HostedAnthropicTools = []string{"web_search_", "web_fetch_", "code_execution_", "tool_search_tool_"}

// HostedResponsesTool reports whether a Responses tool type is one only the vendor runs.
func HostedResponsesTool(typ string) bool {
	for _, h := range HostedResponsesTools {
		if typ == h {
			return true
		}
	}
	return strings.HasPrefix(typ, "web_search_")
}

// HostedAnthropicTool reports whether an Anthropic tool type is a server tool.
func HostedAnthropicTool(typ string) bool {
	for _, h := range HostedAnthropicTools {
		if strings.HasPrefix(typ, h) {
			return true
		}
	}
	return false
}
