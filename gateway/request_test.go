package gateway

import (
	"encoding/json"
	"testing"

	"github.com/macfleet/macfleet/internal/openaierr"
)

func TestPromptPrefix(t *testing.T) {
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	tests := []struct {
		name                    string
		messages, prompt, input json.RawMessage
		n                       int
		want                    string
	}{
		{name: "chat", messages: raw(`[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]`), n: 100,
			want: "system:Be brief.\nuser:Hi\n"},
		{name: "later turns keep the prefix",
			messages: raw(`[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello"},{"role":"user","content":"More"}]`),
			n:        100, want: "system:Be brief.\nuser:Hi\n"},
		{name: "formatting does not matter",
			messages: raw("[ {\"content\" : \"Be brief.\",\n \"role\":\"system\"}, {\"role\":\"user\",\"content\":\"Hi\"}]"), n: 100,
			want: "system:Be brief.\nuser:Hi\n"},
		{name: "content parts", messages: raw(`[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"},{"type":"text","text":"b"}]}]`),
			n: 100, want: "user:ab\n"},
		{name: "truncated", messages: raw(`[{"role":"system","content":"0123456789"}]`), n: 10, want: "system:012"},
		{name: "prompt", prompt: raw(`"once upon a time"`), n: 4, want: "once"},
		{name: "prompt list", prompt: raw(`["first","second"]`), n: 100, want: "first"},
		{name: "embeddings input", input: raw(`["x"]`), n: 100, want: "x"},
		{name: "malformed", messages: raw(`{"not":"a list"}`), n: 100, want: ""},
		{name: "token ids", prompt: raw(`[1,2,3]`), n: 100, want: ""},
		{name: "nothing", n: 100, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(promptPrefix(tt.messages, tt.prompt, tt.input, tt.n)); got != tt.want {
				t.Errorf("prefix %q, want %q", got, tt.want)
			}
		})
	}
}

// TestPrefixAcrossAPIs: one conversation sent as a chat completion, an Anthropic
// message and a Responses request has one prefix, so it lands on the same replica.
func TestPrefixAcrossAPIs(t *testing.T) {
	chat := `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"},{"role":"assistant","content":"Hello"}]}`
	want := "system:Be brief.\nuser:Hi there\n"
	for _, body := range []string{
		chat,
		`{"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"Be brief."}]},{"role":"user","content":"Hi there"}]}`,
		`{"model":"m","system":"Be brief.","messages":[{"role":"user","content":[{"type":"text","text":"Hi there"}]}],"max_tokens":5}`,
		`{"model":"m","system":[{"type":"text","text":"Be brief."}],"messages":[{"role":"user","content":"Hi there"}],"max_tokens":5}`,
		`{"model":"m","instructions":"Be brief.","input":"Hi there"}`,
		`{"model":"m","instructions":"Be brief.","input":[{"role":"user","content":[{"type":"input_text","text":"Hi there"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]}`,
		`{"model":"m","input":[{"type":"message","role":"system","content":"Be brief."},{"role":"user","content":"Hi there"}]}`,
	} {
		h, aerr := parseHead([]byte(body), 64)
		if aerr != nil {
			t.Fatal(aerr)
		}
		if string(h.prefix) != want {
			t.Errorf("%s: prefix %q, want %q", body, h.prefix, want)
		}
	}
	for _, body := range []string{`{"model":"m","input":"Hi there"}`, `{"model":"m","instructions":"Other.","input":"Hi there"}`} {
		if h, _ := parseHead([]byte(body), 64); string(h.prefix) == want {
			t.Errorf("%s: the prefix of another conversation", body)
		}
	}
}

func TestParseHead(t *testing.T) {
	tests := []struct {
		body   string
		model  string
		status int
		code   string
	}{
		{body: `{"model":"qwen","messages":[]}`, model: "qwen"},
		{body: ``, status: 400, code: openaierr.CodeInvalidJSON},
		{body: `{"model":`, status: 400, code: openaierr.CodeInvalidJSON},
		{body: `[1]`, status: 400, code: openaierr.CodeInvalidJSON},
		{body: `"str"`, status: 400, code: openaierr.CodeInvalidJSON},
		{body: `{}`, status: 400, code: openaierr.CodeMissingField},
		{body: `{"model":null}`, status: 400, code: openaierr.CodeMissingField},
		{body: `{"model":""}`, status: 400, code: openaierr.CodeInvalidValue},
		{body: `{"model":42}`, status: 400, code: openaierr.CodeInvalidValue},
		{body: `{"model":"m","messages":"weird"}`, model: "m"},
	}
	for _, tt := range tests {
		for _, pb := range []int{0, 64} {
			h, aerr := parseHead([]byte(tt.body), pb)
			switch {
			case tt.status == 0 && aerr != nil:
				t.Errorf("parseHead(%q, %d): %v", tt.body, pb, aerr)
			case tt.status == 0 && h.Model != tt.model:
				t.Errorf("parseHead(%q, %d): model %q, want %q", tt.body, pb, h.Model, tt.model)
			case tt.status != 0 && (aerr == nil || aerr.Status != tt.status || aerr.Code != tt.code):
				t.Errorf("parseHead(%q, %d): %+v, want %d %s", tt.body, pb, aerr, tt.status, tt.code)
			}
		}
	}
}
