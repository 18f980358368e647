package chat

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// TestAttackTemplateBurnsCPU: a model's chat template walks a 32 MB string a million
// times (indexing it, searching it), each step within the step, size and output
// limits; the runner renders on the request's goroutine, so before the work budget
// each such request burned a core for hours (every index converted the whole string
// to runes). Now indexing is constant time and the rendering completes, and the
// searching gets an OpenAI-shaped 400 on messages naming the work limit, each within
// seconds. The bound is generous (the budget's worst case is about a second of CPU);
// the code before the budget spends longer than that on the first hundred steps.
func TestAttackTemplateBurnsCPU(t *testing.T) {
	const src = `{% set s = 'é' * 16000000 %}{% set ns = namespace(n=0) %}` +
		`{% for i in range(300000) %}` +
		`{% if walk == 'index' %}{% if s[i] == 'x' %}{% set ns.n = ns.n + 1 %}{% endif %}` +
		`{% elif walk == 'search' %}{% set ns.n = ns.n + s.count('x') %}{% endif %}` +
		`{% endfor %}{{ ns.n }}` +
		`{% for m in messages %}<|im_start|>{{ m.role }}` + "\n" + `{{ m.content }}<|im_end|>` + "\n" + `{% endfor %}`
	tmpl, err := NewTemplate(src, "", "<|im_end|>")
	if err != nil {
		t.Fatal(err)
	}
	const bound = 30 * time.Second
	render := func(t *testing.T, walk string) (string, *runnerapi.Error) {
		t.Helper()
		type result struct {
			out string
			e   *runnerapi.Error
		}
		done := make(chan result, 1)
		start := time.Now()
		go func() {
			kw, _ := json.Marshal(walk)
			out, e := tmpl.Render(Input{Messages: []runnerapi.Message{{Role: "user", Content: "hi"}},
				Kwargs: map[string]json.RawMessage{"walk": kw}, AddGenerationPrompt: true}, false)
			done <- result{out, e}
		}()
		select {
		case r := <-done:
			t.Logf("%s: %v", walk, time.Since(start))
			return r.out, r.e
		case <-time.After(bound):
			t.Fatalf("%s: the rendering still burns CPU after %v", walk, bound)
			return "", nil
		}
	}
	t.Run("indexing", func(t *testing.T) {
		out, e := render(t, "index")
		if e != nil {
			t.Fatalf("indexing a long string 300,000 times: %v, want it rendered", e.Message)
		}
		if !strings.HasPrefix(out, "0<|im_start|>user") {
			t.Errorf("rendered %.40q", out)
		}
	})
	t.Run("searching", func(t *testing.T) {
		_, e := render(t, "search")
		if e == nil {
			t.Fatal("searching a 32 MB string 300,000 times rendered, want the work limit")
		}
		body, _ := json.Marshal(e)
		t.Logf("%d %s", e.Status, body)
		if e.Status != http.StatusBadRequest || e.Type != runnerapi.TypeInvalidRequest || e.Param != "messages" ||
			!strings.Contains(e.Message, "work limit") {
			t.Errorf("got %d %s, want a 400 invalid_request_error on messages naming the work limit", e.Status, body)
		}
	})
}
