package gateway

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"github.com/macfleet/macfleet/gateway/budget"
	"github.com/macfleet/macfleet/gateway/metering"
)

// askOf is the budgetAsk of body to endpoint, read as the gateway reads it.
func askOf(t *testing.T, endpoint, body string) budgetAsk {
	t.Helper()
	head, aerr := parseHead([]byte(body), 0)
	if aerr != nil {
		t.Fatalf("parseHead(%s): %v", body, aerr)
	}
	return budgetAsk{endpoint: endpoint, caps: head.caps, lim: usageLimits(endpoint, head, []byte(body)), body: []byte(body)}
}

// TestCapBody: the gateway caps each API's own field, as the agent reads it, leaves
// the rest of the body as it was, and reports the field, the cap and what was
// asked; a body whose cap the agent would read elsewhere (a duplicate key, another
// letter case) is rewritten so that it reads the cap; endpoints without a cap field
// and invalid caps are not capped.
func TestCapBody(t *testing.T) {
	for _, tc := range []struct {
		name, endpoint, body string
		want, report         string // want "": not cappable
	}{
		{name: "chat without max_tokens", endpoint: "chat_completions",
			body:   `{"model":"m","n":16,"messages":[{"role":"user","content":"hi"}]}`,
			want:   `{"model":"m","n":16,"messages":[{"role":"user","content":"hi"}],"max_tokens":9}`,
			report: "max_tokens=9; asked=none"},
		{name: "chat's max_tokens lowered in place", endpoint: "chat_completions",
			body:   `{"model":"m","max_tokens":4096,"messages":[]}`,
			want:   `{"model":"m","max_tokens":9,"messages":[]}`,
			report: "max_tokens=9; asked=4096"},
		{name: "chat's max_completion_tokens is the one the agent reads", endpoint: "chat_completions",
			body:   `{"model":"m","max_tokens":50,"max_completion_tokens":4096}`,
			want:   `{"model":"m","max_tokens":50,"max_completion_tokens":9}`,
			report: "max_completion_tokens=9; asked=4096"},
		{name: "a null max_completion_tokens is none", endpoint: "completions",
			body:   `{"model":"m","max_completion_tokens":null}`,
			want:   `{"model":"m","max_completion_tokens":null,"max_tokens":9}`,
			report: "max_tokens=9; asked=none"},
		{name: "Responses: max_output_tokens", endpoint: "responses", body: `{"model":"m","input":"hi"}`,
			want: `{"model":"m","input":"hi","max_output_tokens":9}`, report: "max_output_tokens=9; asked=none"},
		{name: "Messages: max_tokens", endpoint: "messages", body: `{"model":"m","max_tokens":1024,"messages":[]}`,
			want: `{"model":"m","max_tokens":9,"messages":[]}`, report: "max_tokens=9; asked=1024"},
		{name: "a duplicate key: the last one counts, the body is rewritten", endpoint: "chat_completions",
			body:   `{"model":"m","max_tokens":5,"max_tokens":100000}`,
			want:   `{"max_tokens":9,"model":"m"}`,
			report: "max_tokens=9; asked=100000"},
		{name: "another letter case before the cap: the cap, after it, is read", endpoint: "chat_completions",
			body:   `{"model":"m","MAX_TOKENS":100000}`,
			want:   `{"model":"m","MAX_TOKENS":100000,"max_tokens":9}`,
			report: "max_tokens=9; asked=100000"},
		{name: "another letter case after the field: rewritten", endpoint: "chat_completions",
			body:   `{"model":"m","max_tokens":5,"Max_Tokens":100000}`,
			want:   `{"max_tokens":9,"model":"m"}`,
			report: "max_tokens=9; asked=100000"},
		{name: "embeddings generate nothing", endpoint: "embeddings", body: `{"model":"m","input":"hi"}`},
		{name: "an unknown endpoint", endpoint: "other", body: `{"model":"m"}`},
		{name: "a max_tokens the agent refuses stays its 400", endpoint: "chat_completions", body: `{"model":"m","max_tokens":0}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := askOf(t, tc.endpoint, tc.body)
			c, err := capBody(a, 9)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("capped %s to %s, want it not cappable", tc.body, c.body)
				}
				if req := budgetRequest(a); req.Choices != 0 {
					t.Errorf("budgetRequest = %+v, want its output counted as fixed", req)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(c.body) != tc.want || c.report != tc.report {
				t.Errorf("capBody = %s (%q), want %s (%q)", c.body, c.report, tc.want, tc.report)
			}
			if !capReads(tc.endpoint, c.body, 9) {
				t.Errorf("%s does not read as a cap of 9", c.body)
			}
		})
	}
}

// TestCapRequest: the capped request is sent with its bound lowered to the cap and
// its answer carries HeaderBudgetCapped; budgetRequest is the estimate with the
// output the gateway can cap.
func TestCapRequest(t *testing.T) {
	a := askOf(t, "chat_completions", `{"model":"m","n":4,"messages":[{"role":"user","content":"hi"}]}`)
	a.lim.Context = 1024
	if got, want := budgetRequest(a), (budget.Request{Prompt: int64(len(a.body))/budget.PromptBytesPerToken + 1, Choices: 4,
		Output: 1024 + metering.SlotRounding}); got != want {
		t.Errorf("budgetRequest = %+v, want %+v", got, want)
	}
	w := httptest.NewRecorder()
	body, lim, err := capRequest(w, a, 7)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		MaxTokens int64 `json:"max_tokens"`
		N         int64
	}
	if err := json.Unmarshal(body, &m); err != nil || m.MaxTokens != 7 || m.N != 4 {
		t.Errorf("sent %s, want max_tokens 7 and n 4", body)
	}
	if lim.MaxTokens != 7 || lim.Bound().Output != 28 {
		t.Errorf("bound %+v, want 4 choices of 7", lim)
	}
	if h := w.Header().Get(HeaderBudgetCapped); h != "max_tokens=7; asked=none" {
		t.Errorf("%s: %q", HeaderBudgetCapped, h)
	}
}
