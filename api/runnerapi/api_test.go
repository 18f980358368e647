package runnerapi

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSamplingOptions(t *testing.T) {
	i := func(v int) *int { return &v }
	f := func(v float64) *float64 { return &v }
	tests := []struct {
		name      string
		in        Sampling
		want      Options
		wantParam string // non-empty: an error naming this param
	}{
		{name: "defaults are OpenAI's", in: Sampling{}, want: Options{Temperature: 1, TopP: 1, N: 1}},
		{name: "everything set",
			in: Sampling{MaxTokens: i(5), Temperature: f(0), TopP: f(0.5), TopK: i(40), MinP: f(0.1),
				PresencePenalty: f(-1), FrequencyPenalty: f(2), Stop: StringList{"a", "", "b"}, Stream: true,
				StreamOptions: &StreamOptions{IncludeUsage: true}},
			want: Options{MaxTokens: 5, Temperature: 0, TopP: 0.5, TopK: 40, MinP: 0.1, PresencePenalty: -1,
				FrequencyPenalty: 2, Stop: []string{"a", "b"}, Stream: true, IncludeUsage: true, N: 1}},
		{name: "max_completion_tokens wins", in: Sampling{MaxTokens: i(5), MaxCompletionTokens: i(7)},
			want: Options{MaxTokens: 7, Temperature: 1, TopP: 1, N: 1}},
		{name: "seed", in: Sampling{Seed: func() *int64 { v := int64(-1); return &v }()},
			want: Options{Temperature: 1, TopP: 1, Seed: 0xFFFFFFFF, SeedSet: true, N: 1}},
		{name: "zero max tokens", in: Sampling{MaxTokens: i(0)}, wantParam: "max_tokens"},
		{name: "hot temperature", in: Sampling{Temperature: f(2.5)}, wantParam: "temperature"},
		{name: "top_p above one", in: Sampling{TopP: f(1.5)}, wantParam: "top_p"},
		{name: "negative top_k", in: Sampling{TopK: i(-1)}, wantParam: "top_k"},
		{name: "penalty", in: Sampling{PresencePenalty: f(3)}, wantParam: "presence_penalty"},
		{name: "n", in: Sampling{N: i(3)}, want: Options{Temperature: 1, TopP: 1, N: 3}},
		{name: "n of zero", in: Sampling{N: i(0)}, wantParam: "n"},
		{name: "n above the limit", in: Sampling{N: i(MaxChoices + 1)}, wantParam: "n"},
		{name: "too many stops", in: Sampling{Stop: make(StringList, 17)}, wantParam: "stop"},
		{name: "stream options without stream", in: Sampling{StreamOptions: &StreamOptions{}}, wantParam: "stream_options"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.in.Options()
			if tt.wantParam != "" {
				if err == nil || err.Param != tt.wantParam || err.Status != http.StatusBadRequest {
					t.Fatalf("Options() error = %+v, want a 400 naming %s", err, tt.wantParam)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("Options() (-want +got):\n%s", d)
			}
		})
	}
}

func TestDecodeRequests(t *testing.T) {
	tests := []struct {
		name     string
		body     string
		wantCode string
		check    func(t *testing.T, r ChatRequest)
	}{
		{"string content", `{"messages":[{"role":"user","content":"hi"}],"stop":"x"}`, "", func(t *testing.T, r ChatRequest) {
			if r.Messages[0].Content != "hi" || len(r.Stop) != 1 || r.Stop[0] != "x" {
				t.Errorf("%+v", r)
			}
		}},
		{"text parts and null", `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null}]}`, "", func(t *testing.T, r ChatRequest) {
			if r.Messages[0].Content != "ab" || r.Messages[1].Content != "" {
				t.Errorf("%+v", r)
			}
		}},
		{"unknown fields are ignored", `{"messages":[],"user":"u","logprobs":false}`, "", nil},
		{"syntax", `{"messages":`, CodeInvalidJSON, nil},
		{"empty", ``, CodeInvalidJSON, nil},
		{"trailing", `{} x`, CodeInvalidJSON, nil},
		{"type", `{"temperature":"hot"}`, CodeInvalidValue, nil},
		{"image part", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, CodeInvalidValue, nil},
		{"stop number", `{"stop":3}`, CodeInvalidValue, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r ChatRequest
			err := DecodeJSON([]byte(tt.body), &r)
			switch {
			case tt.wantCode == "" && err != nil:
				t.Fatalf("unexpected error %+v", err)
			case tt.wantCode != "" && (err == nil || err.Code != tt.wantCode):
				t.Fatalf("error %+v, want code %s", err, tt.wantCode)
			}
			if tt.check != nil {
				tt.check(t, r)
			}
		})
	}
}

func TestInput(t *testing.T) {
	tests := []struct {
		in      string
		want    Input
		wantErr bool
	}{
		{`"a"`, Input{Texts: []string{"a"}}, false},
		{`["a","b"]`, Input{Texts: []string{"a", "b"}}, false},
		{`[1,2]`, Input{Tokens: [][]int32{{1, 2}}}, false},
		{`[[1],[2,3]]`, Input{Tokens: [][]int32{{1}, {2, 3}}}, false},
		{`[]`, Input{}, true},
		{`["a",1]`, Input{}, true},
		{`{}`, Input{}, true},
	}
	for _, tt := range tests {
		var got Input
		err := json.Unmarshal([]byte(tt.in), &got)
		if (err != nil) != tt.wantErr {
			t.Errorf("%s: error %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if d := cmp.Diff(tt.want, got); !tt.wantErr && d != "" {
			t.Errorf("%s (-want +got):\n%s", tt.in, d)
		}
	}
}

func TestErrorJSON(t *testing.T) {
	b, err := json.Marshal(PrefillTooLarge(100, 200, 250))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"type": TypeInvalidRequest, "code": CodePrefillMemoryExceeded, "param": nil,
		"estimated_bytes": float64(100), "limit_bytes": float64(250)}
	msg := got["error"]["message"]
	delete(got["error"], "message")
	if d := cmp.Diff(want, got["error"]); d != "" || msg == "" {
		t.Errorf("error body (-want +got):\n%s (message %q)", d, msg)
	}
	b, _ = json.Marshal(InvalidRequest(CodeInvalidValue, "top_p", "bad"))
	if string(b) != `{"error":{"message":"bad","type":"invalid_request_error","code":"invalid_value","param":"top_p"}}` {
		t.Errorf("got %s", b)
	}
}

// TestChatHintsAccepted: the chat fields the compatibility policy (internal/chat/compat) calls
// hints are accepted whatever their value (issue 28); the refused ones stay 400s.
func TestChatHintsAccepted(t *testing.T) {
	for _, tc := range []struct {
		body, wantParam string
	}{
		{`{"store":true}`, ""},
		{`{"service_tier":"flex"}`, ""},
		{`{"verbosity":"low"}`, ""},
		{`{"stream":true,"stream_options":{"include_usage":true,"include_obfuscation":true}}`, ""},
		{`{"prompt_cache_key":"k","prompt_cache_retention":"24h","safety_identifier":"s","metadata":{"a":"b"},"user":"u"}`, ""},
		{`{"logit_bias":{"1":5}}`, "logit_bias"},
		{`{"web_search_options":{}}`, "web_search_options"},
	} {
		var r ChatRequest
		e := DecodeJSON([]byte(tc.body), &r)
		if e == nil {
			e = r.Unsupported.Check()
		}
		got := ""
		if e != nil {
			got = e.Param
		}
		if got != tc.wantParam {
			t.Errorf("%s: error %+v, want one naming %q", tc.body, e, tc.wantParam)
		}
	}
}

// TestChatToolsStrict: strict functions are accepted under every tool_choice (the
// runner holds their calls to the schema: a lazy grammar under "auto"), and the
// checks of the tools themselves still hold.
func TestChatToolsStrict(t *testing.T) {
	const tool = `{"type":"function","function":{"name":"f","parameters":{"type":"object"},"strict":true}}`
	for _, tc := range []struct {
		choice, wantParam string
	}{
		{choice: ""}, {choice: `"auto"`}, {choice: `"required"`}, {choice: `"none"`},
		{choice: `{"type":"function","function":{"name":"f"}}`},
		{choice: `{"type":"function","function":{"name":"g"}}`, wantParam: "tool_choice"},
	} {
		body := `{"messages":[{"role":"user","content":"x"}],"tools":[` + tool + `]`
		if tc.choice != "" {
			body += `,"tool_choice":` + tc.choice
		}
		var r ChatRequest
		if e := DecodeJSON([]byte(body+"}"), &r); e != nil {
			t.Fatalf("%s: %v", tc.choice, e)
		}
		e := r.Check()
		switch {
		case tc.wantParam == "" && e != nil:
			t.Errorf("tool_choice %s: %+v, want the strict tool accepted", tc.choice, e)
		case tc.wantParam != "" && (e == nil || e.Param != tc.wantParam):
			t.Errorf("tool_choice %s: %+v, want an error naming %s", tc.choice, e, tc.wantParam)
		}
	}
}
