package translate

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat/compat"
)

// compatCase is one field a client sends: the request, what of the chat request it
// must become (keys of the chat request, compared as JSON), and the hints header.
type compatCase struct {
	name, body string
	chat       map[string]string
	hints      string
}

// runCompat posts each case through h and compares the chat request and the header.
func runCompat(t *testing.T, h func(http.Handler) http.Handler, path string, cases []compatCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeChat{whole: toolWhole}
			w := post(t, h(f), path, tc.body)
			if w.Code != http.StatusOK {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			got, want := map[string]string{}, map[string]string{}
			for k, v := range tc.chat {
				b, _ := json.Marshal(f.got[k])
				got[k] = string(b)
				var norm any
				if err := json.Unmarshal([]byte(v), &norm); err != nil {
					t.Fatalf("want %s: %v", k, err)
				}
				b, _ = json.Marshal(norm)
				want[k] = string(b)
			}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("chat request (-want +got):\n%s", d)
			}
			if g := w.Header().Get(compat.IgnoredHintsHeader); g != tc.hints {
				t.Errorf("%s: %q, want %q", compat.IgnoredHintsHeader, g, tc.hints)
			}
		})
	}
}

// TestAnthropicClientFields: the fields Claude Code sends on its first request (issue
// 28), each honoured or accepted as a hint and named in the header.
func TestAnthropicClientFields(t *testing.T) {
	const user = `{"role":"user","content":"Hi"}`
	runCompat(t, Anthropic, "/v1/messages?beta=true", []compatCase{
		{name: "context_management", body: `{"model":"m","max_tokens":5,"messages":[` + user + `],
			"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]}}`,
			chat: map[string]string{"messages": `[{"role":"user","content":"Hi"}]`}, hints: "context_management"},
		{name: "output_config effort", body: `{"model":"m","max_tokens":5,"messages":[` + user + `],"output_config":{"effort":"high"}}`,
			chat: map[string]string{"reasoning_effort": `"high"`}},
		{name: "output_config format", body: `{"model":"m","max_tokens":5,"messages":[` + user + `],
			"output_config":{"format":{"type":"json_schema","schema":{"type":"object"}}}}`,
			chat: map[string]string{"response_format": `{"json_schema":{"name":"output","schema":{"type":"object"}},"type":"json_schema"}`}},
		{name: "system message folded", body: `{"model":"m","max_tokens":5,"system":"S1","messages":[` + user + `,
			{"role":"system","content":[{"type":"text","text":"S2"}]},{"role":"assistant","content":"Hello"},` + user + `]}`,
			chat: map[string]string{"messages": `[{"role":"system","content":"S1\n\nS2"},{"role":"user","content":"Hi"},` +
				`{"role":"assistant","content":"Hello"},{"role":"user","content":"Hi"}]`}},
		{name: "thinking adaptive", body: `{"model":"m","max_tokens":5,"messages":[` + user + `],"thinking":{"type":"adaptive"}}`,
			chat: map[string]string{"chat_template_kwargs": `{"enable_thinking":true}`, "reasoning_effort": "null"}},
		{name: "thinking budget", body: `{"model":"m","max_tokens":5,"messages":[` + user + `],"thinking":{"type":"enabled","budget_tokens":20000}}`,
			chat: map[string]string{"chat_template_kwargs": `{"enable_thinking":true}`, "reasoning_effort": `"high"`}},
		{name: "cache_control", body: `{"model":"m","max_tokens":5,"system":[{"type":"text","text":"S","cache_control":{"type":"ephemeral"}}],
			"tools":[{"name":"f","input_schema":{"type":"object"},"cache_control":{"type":"ephemeral"}}],
			"messages":[{"role":"user","content":[{"type":"text","text":"Hi","cache_control":{"type":"ephemeral","ttl":"1h"}}]}]}`,
			chat: map[string]string{"messages": `[{"role":"system","content":"S"},{"role":"user","content":"Hi"}]`}, hints: "cache_control"},
		{name: "server tool dropped", body: `{"model":"m","max_tokens":5,"messages":[` + user + `],
			"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":3},{"name":"f","input_schema":{"type":"object"}}]}`,
			chat:  map[string]string{"tools": `[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`},
			hints: "tools[web_search_20250305]"},
		{name: "metadata and service_tier", body: `{"model":"m","max_tokens":5,"messages":[` + user + `],
			"metadata":{"user_id":"u"},"service_tier":"auto"}`, chat: map[string]string{}, hints: "metadata"},
	})
}

// TestAnthropicToolFields: every field of a client tool and of thinking that newer
// clients send (issue 45) is honoured, or accepted as a hint and named in the header
// when its value asks for something macfleet does not do.
func TestAnthropicToolFields(t *testing.T) {
	const user = `{"role":"user","content":"Hi"}`
	const schema = `"input_schema":{"type":"object"}`
	tools := func(fields ...string) string {
		var ts []string
		for _, f := range fields {
			ts = append(ts, `{"name":"f",`+schema+f+`}`)
		}
		return `{"model":"m","max_tokens":5,"messages":[` + user + `],"tools":[` + strings.Join(ts, ",") + `]`
	}
	const plain = `[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`
	runCompat(t, Anthropic, "/v1/messages", []compatCase{
		{name: "defer_loading", body: tools(`,"defer_loading":true`) + `}`, chat: map[string]string{"tools": plain},
			hints: "tools[].defer_loading"},
		{name: "defer_loading false", body: tools(`,"defer_loading":false`) + `}`, chat: map[string]string{"tools": plain}},
		{name: "eager_input_streaming", body: tools(`,"eager_input_streaming":true`) + `}`, chat: map[string]string{"tools": plain},
			hints: "tools[].eager_input_streaming"},
		{name: "allowed_callers direct", body: tools(`,"allowed_callers":["direct"]`) + `}`, chat: map[string]string{"tools": plain}},
		{name: "allowed_callers code execution too", body: tools(`,"allowed_callers":["direct","code_execution_20250825"]`) + `}`,
			chat: map[string]string{"tools": plain}, hints: "tools[].allowed_callers"},
		{name: "allowed_callers code execution only", body: `{"model":"m","max_tokens":5,"messages":[` + user + `],"tools":[` +
			`{"name":"f",` + schema + `},{"name":"g",` + schema + `,"allowed_callers":["code_execution_20250825"]}]}`,
			chat: map[string]string{"tools": plain}, hints: "tools[].allowed_callers"},
		{name: "strict with a forced call", body: tools(`,"strict":true`) + `,"tool_choice":{"type":"any"}}`,
			chat: map[string]string{"tools": `[{"type":"function","function":{"name":"f","parameters":{"type":"object"},"strict":true}}]`,
				"tool_choice": `"required"`}},
		{name: "strict under auto", body: tools(`,"strict":true`) + `}`,
			chat: map[string]string{"tools": `[{"type":"function","function":{"name":"f","parameters":{"type":"object"},"strict":true}}]`}},
		{name: "strict false", body: tools(`,"strict":false`) + `}`,
			chat: map[string]string{"tools": `[{"type":"function","function":{"name":"f","parameters":{"type":"object"},"strict":false}}]`}},
		{name: "input_examples", body: tools(`,"description":"Gets it.","input_examples":[{"city": "Paris"},{"city":"Oslo","unit":"c"}]`) + `}`,
			chat: map[string]string{"tools": `[{"type":"function","function":{"name":"f","parameters":{"type":"object"},` +
				`"description":"Gets it.\n\nExample inputs:\n{\"city\":\"Paris\"}\n{\"city\":\"Oslo\",\"unit\":\"c\"}"}}]`}},
		{name: "thinking display omitted", body: `{"model":"m","max_tokens":5,"messages":[` + user + `],"thinking":{"type":"enabled","budget_tokens":2048,"display":"omitted"}}`,
			chat: map[string]string{"chat_template_kwargs": `{"enable_thinking":true}`, "reasoning_effort": `"low"`}, hints: "thinking.display"},
		{name: "thinking display summarized", body: `{"model":"m","max_tokens":5,"messages":[` + user + `],"thinking":{"type":"adaptive","display":"summarized"}}`,
			chat: map[string]string{"chat_template_kwargs": `{"enable_thinking":true}`}, hints: "thinking.display"},
		{name: "server tool's own fields", body: `{"model":"m","max_tokens":5,"messages":[` + user + `],"tools":[` +
			`{"type":"web_fetch_20250910","name":"web_fetch","max_uses":5,"max_content_tokens":1000,"citations":{"enabled":true}},{"name":"f",` + schema + `}]}`,
			chat: map[string]string{"tools": plain}, hints: "tools[web_fetch_20250910]"},
		{name: "hints together", body: tools(`,"defer_loading":true,"eager_input_streaming":true,"allowed_callers":["direct","code_execution_20250825"]`) +
			`,"thinking":{"type":"adaptive","display":"omitted"},"metadata":{"user_id":"u"}}`,
			chat:  map[string]string{"tools": plain},
			hints: "metadata, tools[].defer_loading, tools[].eager_input_streaming, tools[].allowed_callers, thinking.display"},
	})
}

// TestAnthropicNewClientTools: Claude Code's recorded first request, with the tool
// and thinking fields of newer clients on its eleventh tool, is served and its hints
// named; an unknown field there is a 400 naming where it is.
func TestAnthropicNewClientTools(t *testing.T) {
	b, err := os.ReadFile("testdata/clients/claude-code-2.1.197-turn1.json")
	if err != nil {
		t.Fatal(err)
	}
	var fx clientFixture
	if err := json.Unmarshal(b, &fx); err != nil {
		t.Fatal(err)
	}
	with := func(tool map[string]any, thinking map[string]any) string {
		var body map[string]any
		if err := json.Unmarshal(fx.Body, &body); err != nil {
			t.Fatal(err)
		}
		tools := body["tools"].([]any)
		if len(tools) < 11 {
			t.Fatalf("the fixture has %d tools", len(tools))
		}
		for k, v := range tool {
			tools[10].(map[string]any)[k] = v
		}
		for k, v := range thinking {
			body["thinking"].(map[string]any)[k] = v
		}
		out, _ := json.Marshal(body)
		return string(out)
	}
	body := with(map[string]any{"defer_loading": true, "eager_input_streaming": true, "strict": false,
		"input_examples": []any{map[string]any{}}, "allowed_callers": []any{"direct"}}, map[string]any{"display": "omitted"})
	w := post(t, Anthropic(&fakeChat{whole: toolWhole, chunks: toolStream}), fx.Path, body)
	if w.Code != http.StatusOK {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if h, want := w.Header().Get(compat.IgnoredHintsHeader), "metadata, context_management, tools[].defer_loading, "+
		"tools[].eager_input_streaming, thinking.display, cache_control"; h != want {
		t.Errorf("%s: %q, want %q", compat.IgnoredHintsHeader, h, want)
	}
	w = post(t, Anthropic(&fakeChat{whole: toolWhole, chunks: toolStream}), fx.Path, with(map[string]any{"defer_loadin": true}, nil))
	var e struct {
		Error struct{ Type, Message string }
	}
	_ = json.Unmarshal(w.Body.Bytes(), &e)
	if w.Code != http.StatusBadRequest || !strings.Contains(e.Error.Message, `"tools[10].defer_loadin"`) {
		t.Errorf("an unknown tool field: %d %s, want a 400 naming tools[10].defer_loadin", w.Code, w.Body)
	}
}

// TestAnthropicRefusals: what the policy refuses is a 400 naming the field.
func TestAnthropicRefusals(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"mcp_servers":[{"type":"url","url":"u","name":"n"}]}`, "mcp_servers"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"type":"bash_20250124","name":"bash"}]}`, "tools[0].type"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"sometimes"}}`, "thinking.type"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"context_managment":{}}`, "context_managment"},
		// Unknown nested fields are named by their whole path.
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":{}},` +
			`{"name":"g","input_schema":{},"foo":1}]}`, `"tools[1].foo"`},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled","budgetTokens2":1}}`, `"thinking.budgetTokens2"`},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"auto","parallel":false}}`, `"tool_choice.parallel"`},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"text","text":"y","extra":1}]}]}`,
			`"messages[1].content[0].extra"`},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"f","input_schema":{},"input_examples":[1]}]}`,
			"tools[0].input_examples[0]"},
		{`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled","display":"verbose"}}`, "thinking.display"},
	} {
		w := post(t, Anthropic(&fakeChat{whole: toolWhole}), "/v1/messages", tc.body)
		var e struct {
			Error struct{ Type, Message string }
		}
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != http.StatusBadRequest || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("%s: %d %s, want a 400 naming %s", tc.body, w.Code, w.Body, tc.want)
		}
	}
}

// TestResponsesClientFields: the fields Codex sends on its first request (issue 28).
func TestResponsesClientFields(t *testing.T) {
	const fn = `{"type":"function","name":"exec_command","parameters":{"type":"object"},"strict":false}`
	runCompat(t, Responses, "/v1/responses", []compatCase{
		{name: "namespace tools", body: `{"model":"m","input":"x","tools":[` + fn + `,{"type":"namespace","name":"multi_agent_v1",
			"description":"Agents.","tools":[{"type":"function","name":"spawn_agent","description":"Spawn.","parameters":{"type":"object"},"strict":false,
			"defer_loading":true}]}]}`,
			chat: map[string]string{"tools": `[{"type":"function","function":{"name":"exec_command","parameters":{"type":"object"},"strict":false}},` +
				`{"type":"function","function":{"name":"spawn_agent","description":"Spawn.","parameters":{"type":"object"},"strict":false}}]`},
			hints: "tools[].defer_loading"},
		{name: "defer_loading on a function", body: `{"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":{"type":"object"},
			"defer_loading":true},{"type":"function","name":"g","defer_loading":true}]}`,
			chat: map[string]string{"tools": `[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}},` +
				`{"type":"function","function":{"name":"g"}}]`},
			hints: "tools[].defer_loading"},
		{name: "strict under auto", body: `{"model":"m","input":"x","tool_choice":"auto","tools":[{"type":"function","name":"f",` +
			`"parameters":{"type":"object"},"strict":true}]}`,
			chat: map[string]string{"tools": `[{"type":"function","function":{"name":"f","parameters":{"type":"object"},"strict":true}}]`,
				"tool_choice": `"auto"`}},
		{name: "defer_loading false", body: `{"model":"m","input":"x","tools":[{"type":"function","name":"f","defer_loading":false}]}`,
			chat: map[string]string{"tools": `[{"type":"function","function":{"name":"f"}}]`}},
		{name: "namespace name clash", body: `{"model":"m","input":"x","tools":[` + fn + `,{"type":"namespace","name":"ns","description":"",
			"tools":[` + fn + `]}]}`,
			chat: map[string]string{"tools": `[{"type":"function","function":{"name":"exec_command","parameters":{"type":"object"},"strict":false}},` +
				`{"type":"function","function":{"name":"ns__exec_command","parameters":{"type":"object"},"strict":false}}]`}},
		{name: "namespaced call in the history", body: `{"model":"m","tools":[{"type":"namespace","name":"ns","description":"","tools":[` + fn + `]}],
			"input":[{"type":"function_call","call_id":"c1","namespace":"ns","name":"exec_command","arguments":"{}"},
			{"type":"function_call_output","call_id":"c1","output":"ok"}]}`,
			chat: map[string]string{"messages": `[{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function",` +
				`"function":{"name":"exec_command","arguments":"{}"}}]},{"role":"tool","content":"ok","tool_call_id":"c1"}]`}},
		{name: "web_search dropped", body: `{"model":"m","input":"x","tools":[` + fn + `,{"type":"web_search","external_web_access":false}]}`,
			chat:  map[string]string{"tools": `[{"type":"function","function":{"name":"exec_command","parameters":{"type":"object"},"strict":false}}]`},
			hints: "tools[web_search]"},
		{name: "prompt_cache_key", body: `{"model":"m","input":"x","prompt_cache_key":"thread-1"}`,
			chat: map[string]string{"prompt_cache_key": `"thread-1"`}},
		{name: "client_metadata", body: `{"model":"m","input":"x","client_metadata":{"session_id":"s"}}`,
			chat: map[string]string{}, hints: "client_metadata"},
		{name: "include", body: `{"model":"m","input":"x","include":["reasoning.encrypted_content"]}`,
			chat: map[string]string{}, hints: "include"},
		{name: "store false", body: `{"model":"m","input":"x","store":false,"stream_options":{"include_obfuscation":false}}`, chat: map[string]string{}},
		{name: "context_management", body: `{"model":"m","input":"x","context_management":[{"type":"compaction","compact_threshold":1000}]}`,
			chat: map[string]string{}, hints: "context_management"},
		{name: "store true", body: `{"model":"m","input":"x","store":true}`, chat: map[string]string{}, hints: "store"},
		{name: "hints together", body: `{"model":"m","service_tier":"flex","safety_identifier":"u","reasoning":{"summary":"auto"},
			"input":[{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"opaque"},{"type":"message","role":"user","content":"x"}]}`,
			chat: map[string]string{"messages": `[{"role":"user","content":"x"}]`}, hints: "safety_identifier, service_tier, reasoning.summary"},
	})
}

// TestResponsesNamespacedCall: a call of a namespaced function comes back in the
// client's terms, its namespace and its own name, streamed or not.
func TestResponsesNamespacedCall(t *testing.T) {
	body := `{"model":"m","input":"x","tools":[{"type":"namespace","name":"weather","description":"",
		"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}]}]}`
	w := post(t, Responses(&fakeChat{whole: toolWhole}), "/v1/responses", body)
	var resp struct{ Output []map[string]any }
	if err := json.Unmarshal(w.Body.Bytes(), &resp); err != nil || len(resp.Output) != 3 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if d := cmp.Diff(map[string]any{"type": "function_call", "id": "fc_abc_3", "call_id": "call_1", "name": "get_weather",
		"namespace": "weather", "arguments": `{"city":"Paris"}`, "status": "completed"}, resp.Output[2]); d != "" {
		t.Errorf("call (-want +got):\n%s", d)
	}
	w = post(t, Responses(&fakeChat{chunks: toolStream}), "/v1/responses", body[:len(body)-1]+`,"stream":true}`)
	events := readEvents(t, w.Body)
	var done map[string]any
	for _, e := range events {
		if e.event == "response.output_item.done" && e.data["item"].(map[string]any)["type"] == "function_call" {
			done = e.data["item"].(map[string]any)
		}
	}
	if done["namespace"] != "weather" || done["name"] != "get_weather" || done["arguments"] != `{"city":"Paris"}` {
		t.Errorf("streamed call %v", done)
	}
}

// TestResponsesRefusals: what the policy refuses is a 400 naming the field.
func TestResponsesRefusals(t *testing.T) {
	for _, tc := range []struct{ body, param string }{
		{`{"model":"m","input":"x","include":["bogus.item"]}`, "include[0]"},
		{`{"model":"m","input":"x","conversation":"conv_1"}`, "conversation"},
		{`{"model":"m","input":"x","tools":[{"type":"custom","name":"apply_patch","format":{"type":"grammar","syntax":"lark","definition":"start: \"a\"\n%ignore \" \""}}]}`,
			"tools[0].format.definition"},
		{`{"model":"m","input":"x","tools":[{"type":"custom","name":"apply_patch","format":{"type":"grammar","syntax":"ebnf","definition":"x"}}]}`,
			"tools[0].format.syntax"},
		{`{"model":"m","input":"x","tools":[{"type":"custom","name":"apply_patch","format":{"type":"json"}}]}`, "tools[0].format.type"},
		{`{"model":"m","input":"x","tools":[{"type":"custom","name":"apply_patch","bogus":1}]}`, "tools[0].bogus"},
		{`{"model":"m","input":"x","tools":[{"type":"namespace","name":"n","tools":[{"type":"custom","name":"x"}]}]}`, "tools[0].tools[0].type"},
		{`{"model":"m","input":"x","truncation":"auto"}`, "truncation"},
		{`{"model":"m","input":"x","prompt_cache_kee":"k"}`, "prompt_cache_kee"},
		{`{"model":"m","input":"x","tools":[{"type":"namespace","name":"n","tools":[{"type":"function","name":"f"},{"type":"function","name":"g","bogus":1}]}]}`,
			"tools[0].tools[1].bogus"},
	} {
		w := post(t, Responses(&fakeChat{whole: toolWhole}), "/v1/responses", tc.body)
		var e struct{ Error struct{ Param *string } }
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != tc.param {
			t.Errorf("%s: %d %s, want a 400 naming %s", tc.body, w.Code, w.Body, tc.param)
		}
	}
}

// TestAnthropicUsage: message_start reports the prompt's size, which the chat
// stream's first chunk carries when the translator asks for it; the cached part is
// cache_read_input_tokens there, in message_delta and in a whole answer.
func TestAnthropicUsage(t *testing.T) {
	first := `{"id":"chatcmpl-abc","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],` +
		`"usage":{"prompt_tokens":19626,"completion_tokens":0,"total_tokens":19626,"prompt_tokens_details":{"cached_tokens":19000}}}`
	last := `{"id":"chatcmpl-abc","model":"m","choices":[],"usage":{"prompt_tokens":19626,"completion_tokens":9,"total_tokens":19635,` +
		`"prompt_tokens_details":{"cached_tokens":19000}}}`
	chunks := append(append([]string{first}, toolStream[1:len(toolStream)-1]...), last)
	f := &fakeChat{chunks: chunks}
	w := post(t, Anthropic(f), "/v1/messages", `{"model":"m","max_tokens":50,"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	if got := f.header.Get(runnerapi.HeaderPromptUsage); got != "first-chunk" {
		t.Errorf("the chat request's %s = %q, want first-chunk", runnerapi.HeaderPromptUsage, got)
	}
	events := readEvents(t, w.Body)
	want := map[string]any{"input_tokens": 626.0, "cache_read_input_tokens": 19000.0, "cache_creation_input_tokens": 0.0, "output_tokens": 0.0}
	if d := cmp.Diff(want, events[0].data["message"].(map[string]any)["usage"]); d != "" {
		t.Errorf("message_start usage (-want +got):\n%s", d)
	}
	want["output_tokens"] = 9.0
	if d := cmp.Diff(want, events[len(events)-2].data["usage"]); d != "" {
		t.Errorf("message_delta usage (-want +got):\n%s", d)
	}

	whole := toolWhole
	whole.Usage = &runnerapi.Usage{PromptTokens: 100, CompletionTokens: 9, TotalTokens: 109, PromptTokensDetails: &runnerapi.PromptTokensDetails{CachedTokens: 64}}
	w = post(t, Anthropic(&fakeChat{whole: whole}), "/v1/messages", `{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"x"}]}`)
	var resp struct{ Usage map[string]any }
	_ = json.Unmarshal(w.Body.Bytes(), &resp)
	if d := cmp.Diff(map[string]any{"input_tokens": 36.0, "cache_read_input_tokens": 64.0, "cache_creation_input_tokens": 0.0,
		"output_tokens": 9.0}, resp.Usage); d != "" {
		t.Errorf("usage (-want +got):\n%s", d)
	}
}

// TestAnthropicCountTokens: count_tokens translates the request as /v1/messages does
// (max_tokens may be left out) and answers the count handler's count in Anthropic's
// shape; the handler's errors come back Anthropic-shaped.
func TestAnthropicCountTokens(t *testing.T) {
	var got map[string]any
	count := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&got)
		if got["model"] == "missing" {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":{"message":"model \"missing\" not found","type":"invalid_request_error","code":"model_not_found"}}`))
			return
		}
		_, _ = w.Write([]byte(`{"prompt_tokens":1234}`))
	})
	w := post(t, AnthropicCountTokens(count), "/v1/messages/count_tokens", `{"model":"m","system":"S",
		"messages":[{"role":"user","content":"Hi"}],"thinking":{"type":"adaptive"},"context_management":{"edits":[]},
		"tools":[{"name":"f","input_schema":{"type":"object"}}]}`)
	if w.Code != http.StatusOK || strings.TrimSpace(w.Body.String()) != `{"input_tokens":1234}` {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if got["max_tokens"] != nil || got["stream"] != false || got["tools"] == nil || got["chat_template_kwargs"] == nil {
		t.Errorf("the chat request %v", got)
	}
	if h := w.Header().Get(compat.IgnoredHintsHeader); h != "context_management" {
		t.Errorf("hints %q", h)
	}
	w = post(t, AnthropicCountTokens(count), "/v1/messages/count_tokens", `{"model":"missing","messages":[{"role":"user","content":"Hi"}]}`)
	var e struct {
		Type  string
		Error struct{ Type, Message string }
	}
	_ = json.Unmarshal(w.Body.Bytes(), &e)
	if w.Code != http.StatusNotFound || e.Type != "error" || e.Error.Type != "not_found_error" {
		t.Errorf("%d %s", w.Code, w.Body)
	}
}
