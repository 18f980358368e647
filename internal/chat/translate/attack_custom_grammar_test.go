package translate

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"path/filepath"
	"strings"
	"testing"
)

// TestAttackCustomToolGrammarBomb: a custom tool's grammar is compiled by llama.cpp
// in the runner, whose parser recurses per group on its thread's stack. Groups nested
// 21,000 deep (in the 64 KiB a grammar may have) overflowed it and the runner died
// with every request it held; now the translator and the runner refuse them with a
// 400 naming the nesting, and the runner goes on serving. A chain of rules each
// starting with the next (which the sampler also walks recursively) as long as the
// size allows, and groups nested to the bound, are served.
func TestAttackCustomToolGrammarBomb(t *testing.T) {
	base := startRunner(t, filepath.Join("..", "..", "..", "test", "models", "tiny-chat-trained.gguf"))
	ts := httptest.NewServer(Responses(httputil.NewSingleHostReverseProxy(base)))
	defer ts.Close()
	nested := "A: \"a\"\nstart: " + strings.Repeat("(A", 21000) + " A" + strings.Repeat(")", 21000)
	var chain strings.Builder
	chain.WriteString("start: r0\n")
	for i := 0; chain.Len() < 60<<10; i++ {
		fmt.Fprintf(&chain, "r%d: r%d \"x\"\n", i, i+1) // each rule starts with the next
	}
	n := strings.Count(chain.String(), "\n") - 1
	fmt.Fprintf(&chain, "r%d: \"x\"\n", n)

	post := func(url string, body any) (int, string) {
		b, _ := json.Marshal(body)
		res, err := http.Post(url, "application/json", strings.NewReader(string(b)))
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		out, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(out)
	}
	responsesBody := func(def string) any {
		return map[string]any{"model": "m", "input": "Go.", "max_output_tokens": 4, "tools": []any{map[string]any{"type": "custom",
			"name": "t", "format": map[string]any{"type": "grammar", "syntax": "lark", "definition": def}}},
			"tool_choice": map[string]any{"type": "custom", "name": "t"}}
	}
	chatBody := func(def string) any { // straight to the runner, past the translator
		return map[string]any{"model": "m", "max_tokens": 4, "messages": []any{map[string]any{"role": "user", "content": "Go."}},
			"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "t",
				"input_grammar": map[string]any{"syntax": "lark", "definition": def}}}}, "tool_choice": "required"}
	}
	for _, tc := range []struct {
		name, url string
		body      any
		status    int
		says      string
	}{
		{"nested, Responses", ts.URL + "/v1/responses", responsesBody(nested), http.StatusBadRequest, "nest more than 64 deep"},
		{"nested, runner", base.String() + "/v1/chat/completions", chatBody(nested), http.StatusBadRequest, "nest more than 64 deep"},
		{"chain, runner", base.String() + "/v1/chat/completions", chatBody(chain.String()), http.StatusOK, ""},
		{"nested 64, runner", base.String() + "/v1/chat/completions",
			chatBody("A: \"a\"\nstart: " + strings.Repeat("(A", 64) + " A" + strings.Repeat(")", 64)), http.StatusOK, ""},
	} {
		status, body := post(tc.url, tc.body)
		if status != tc.status || !strings.Contains(body, tc.says) {
			t.Errorf("%s: %d %.300s; want %d saying %q", tc.name, status, body, tc.status, tc.says)
		}
		// The runner still serves.
		if status, body := post(base.String()+"/v1/chat/completions", map[string]any{"model": "m", "max_tokens": 1,
			"messages": []any{map[string]any{"role": "user", "content": "Hi"}}}); status != http.StatusOK {
			t.Fatalf("after %s the runner answers %d %.200s", tc.name, status, body)
		}
	}
	t.Logf("a chain of %d rules", n)
}
