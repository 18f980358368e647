package chat

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/test/support/testassets"
)

func request(t *testing.T, body string) *runnerapi.ChatRequest {
	t.Helper()
	var req runnerapi.ChatRequest
	if e := runnerapi.DecodeJSON([]byte(body), &req); e != nil {
		t.Fatal(e)
	}
	if e := req.Check(); e != nil {
		t.Fatal(e)
	}
	return &req
}

func TestRenderLlama31Tools(t *testing.T) {
	src, err := testassets.Find("llama3-instruct", "tool_calls")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := NewTemplate(src.Source, "<|begin_of_text|>", "<|eot_id|>")
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Format != FormatLlama3 || !tmpl.Tools {
		t.Fatalf("format %v tools %v, want llama3-json with tools", tmpl.Format, tmpl.Tools)
	}
	req := request(t, `{"model":"m","messages":[
		{"role":"system","content":"Be brief."},
		{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
		{"role":"tool","tool_call_id":"call_1","content":"21 C"}],
		"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather now","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]}`)
	out, e := tmpl.Render(InputOf(req), true)
	if e != nil {
		t.Fatal(e)
	}
	for _, want := range []string{
		// the tool's schema, key order as sent
		`"name": "get_weather",` + "\n" + `        "description": "Weather now",` + "\n" + `        "parameters": {` + "\n" + `            "type": "object",`,
		// the call in the history, arguments decoded from their JSON string
		`{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>`,
		// the tool result (this template prints string content with tojson, as Jinja2 does)
		"<|start_header_id|>ipython<|end_header_id|>\n\n\"21 C\"<|eot_id|>",
		// the generation prompt
		"<|start_header_id|>assistant<|end_header_id|>\n\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("prompt lacks %q:\n%s", want, out)
		}
	}
	if strings.HasPrefix(out, "<|begin_of_text|>") {
		t.Errorf("BOS text not stripped: %q", out[:40])
	}
	// tool_choice none renders without the tools.
	req.ToolChoice = &runnerapi.ToolChoice{Mode: "none"}
	out, e = tmpl.Render(InputOf(req), true)
	if e != nil || strings.Contains(out, "Weather now") {
		t.Fatalf("tool_choice none: %v, prompt mentions the tool: %v", e, strings.Contains(out, "Weather now"))
	}
}

func TestRenderErrors(t *testing.T) {
	chatml := "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
	strict := "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{{ m.content }}{% endfor %}"
	for _, tc := range []struct {
		name, tmpl, body, code, param, msg string
	}{
		{"tools on a template without tools", chatml,
			`{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
			runnerapi.CodeUnsupportedParameter, "tools", "does not render tools"},
		{"raise_exception", strict, `{"model":"m","messages":[{"role":"system","content":"x"},{"role":"user","content":"hi"}]}`,
			runnerapi.CodeTemplateError, "messages", "refused the conversation: System role not supported"},
		{"bad arguments", chatml,
			`{"model":"m","messages":[{"role":"assistant","content":"","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{not json"}}]}]}`,
			runnerapi.CodeInvalidValue, "messages[0].tool_calls[0].function.arguments", "arguments must be a JSON string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := NewTemplate(tc.tmpl, "", "")
			if err != nil {
				t.Fatal(err)
			}
			_, e := tmpl.Render(InputOf(request(t, tc.body)), false)
			if e == nil || e.Status != 400 || e.Code != tc.code || e.Param != tc.param || !strings.Contains(e.Message, tc.msg) {
				b, _ := json.Marshal(e)
				t.Fatalf("error %s, want 400 %s on %s mentioning %q", b, tc.code, tc.param, tc.msg)
			}
		})
	}
}

func TestRequestFields(t *testing.T) {
	for _, tc := range []struct {
		body, code, param string
	}{
		{`{"model":"m","messages":[],"frobnicate":1}`, runnerapi.CodeUnknownParameter, "frobnicate"},
		{`{"model":"m","messages":[],"response_format":{"type":"json"}}`, runnerapi.CodeInvalidValue, "response_format.type"},
		{`{"model":"m","messages":[],"response_format":{"type":"json_schema","json_schema":{"name":"a b","schema":{}}}}`, runnerapi.CodeInvalidValue, "response_format.json_schema.name"},
		{`{"model":"m","messages":[],"response_format":{"type":"json_object","json_schema":{"name":"a","schema":{}}}}`, runnerapi.CodeInvalidValue, "response_format.json_schema"},
		{`{"model":"m","messages":[],"top_logprobs":3}`, runnerapi.CodeInvalidValue, "top_logprobs"},
		{`{"model":"m","messages":[],"n":0}`, runnerapi.CodeInvalidValue, "n"},
		{`{"model":"m","messages":[],"logit_bias":{"1":5}}`, runnerapi.CodeUnsupportedParameter, "logit_bias"},
		{`{"model":"m","messages":[],"audio":{"voice":"x"}}`, runnerapi.CodeUnsupportedParameter, "audio"},
		{`{"model":"m","messages":[],"tool_choice":"required"}`, runnerapi.CodeInvalidValue, "tool_choice"},
		{`{"model":"m","messages":[],"tool_choice":{"type":"function","function":{"name":"g"}},"tools":[{"type":"function","function":{"name":"f"}}]}`, runnerapi.CodeInvalidValue, "tool_choice"},
		{`{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"bad name"}}]}`, runnerapi.CodeInvalidValue, "tools[0].function.name"},
		{`{"model":"m","messages":[{"role":"tool","content":"x"}]}`, runnerapi.CodeInvalidValue, "messages[0].tool_call_id"},
		{`{"model":"m","messages":[{"role":"user","content":"x","extra":1}]}`, runnerapi.CodeUnknownParameter, "extra"},
	} {
		var req runnerapi.ChatRequest
		e := runnerapi.DecodeJSON([]byte(tc.body), &req)
		if e == nil {
			if _, e = req.Options(); e == nil {
				e = req.Check()
			}
		}
		if e == nil || e.Code != tc.code || e.Param != tc.param {
			t.Errorf("%s: got %+v, want %s on %s", tc.body, e, tc.code, tc.param)
		}
	}
	// A strict tool under tool_choice auto is honoured (a lazy grammar from the call's
	// opening), so accepted.
	request(t, `{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"f","strict":true}}]}`)
	// What the official clients send back in the history is accepted.
	request(t, `{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"f","strict":true}}],"tool_choice":"required","response_format":{"type":"json_schema","json_schema":{"name":"a","strict":true,"schema":{"type":"object"}}}}`)
	request(t, `{"model":"m","messages":[{"role":"assistant","content":null,"parsed":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}","parsed_arguments":{}}}]},{"role":"tool","tool_call_id":"c","content":"1"}],"tools":[{"type":"function","function":{"name":"f"}}]}`)
	request(t, `{"model":"m","user":"u1","store":false,"messages":[{"role":"assistant","content":"hi","refusal":null,"annotations":[],"audio":null}],"parallel_tool_calls":true,"tool_choice":"auto","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`)
}

// BenchmarkRenderRequest: a 50-message conversation with tools, tool calls and tool
// results through the real Llama 3.1 template, as the runner does per request
// ("render": decode, then render), against decoding the request alone ("decode"), the
// baseline every request pays (target for render: under 1 ms).
func BenchmarkRenderRequest(b *testing.B) {
	src, err := testassets.Find("llama3-instruct", "tool_calls")
	if err != nil {
		b.Fatal(err)
	}
	tmpl, err := NewTemplate(src.Source, "<|begin_of_text|>", "<|eot_id|>")
	if err != nil {
		b.Fatal(err)
	}
	var sb strings.Builder
	sb.WriteString(`{"model":"m","tools":[{"type":"function","function":{"name":"search","description":"Search the docs","parameters":{"type":"object","properties":{"query":{"type":"string"},"limit":{"type":"integer"}},"required":["query"]}}}],"messages":[{"role":"system","content":"You are a helpful assistant."}`)
	for i := 1; i < 50; i++ {
		switch i % 4 {
		case 1:
			fmt.Fprintf(&sb, `,{"role":"user","content":"Question %d about the fleet: how much memory does the model on mac-%d use right now?"}`, i, i)
		case 2:
			fmt.Fprintf(&sb, `,{"role":"assistant","content":null,"tool_calls":[{"id":"call_%d","type":"function","function":{"name":"search","arguments":"{\"query\":\"memory mac-%d\",\"limit\":3}"}}]}`, i, i)
		case 3:
			fmt.Fprintf(&sb, `,{"role":"tool","tool_call_id":"call_%d","content":"{\"resident_bytes\": %d}"}`, i-1, i*1000000)
		default:
			fmt.Fprintf(&sb, `,{"role":"assistant","content":"The model on mac-%d holds about %d MB resident."}`, i, i)
		}
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req runnerapi.ChatRequest
			if e := runnerapi.DecodeJSON(body, &req); e != nil {
				b.Fatal(e)
			}
		}
	})
	b.Run("render", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req runnerapi.ChatRequest
			if e := runnerapi.DecodeJSON(body, &req); e != nil {
				b.Fatal(e)
			}
			if _, e := tmpl.Render(InputOf(&req), true); e != nil {
				b.Fatal(e)
			}
		}
	})
}
