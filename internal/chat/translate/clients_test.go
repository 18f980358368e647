package translate

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/chat/compat"
)

// clientFixture is a recorded request of a real client (testdata/clients/README.md).
type clientFixture struct {
	Method string            `json:"method"`
	Path   string            `json:"path"`
	Header map[string]string `json:"header"`
	Body   json.RawMessage   `json:"body"`
}

// TestClientFixtures replays every recorded request of Claude Code and Codex CLI
// through the translators: each is accepted, and each of its top-level fields is one
// the policy honours or takes as a hint (none refused, none unknown). A client
// upgrade that sends something new fails here.
func TestClientFixtures(t *testing.T) {
	files, err := filepath.Glob("testdata/clients/*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Skip("no recorded client requests in testdata/clients (test/e2e's TestCodingAgents records them)")
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			b, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var fx clientFixture
			if err := json.Unmarshal(b, &fx); err != nil {
				t.Fatal(err)
			}
			path, _, _ := strings.Cut(fx.Path, "?")
			var h http.Handler
			var p *compat.Policy
			f := &fakeChat{whole: toolWhole, chunks: toolStream}
			switch path {
			case "/v1/messages":
				h, p = Anthropic(f), &compat.Messages
			case "/v1/responses":
				h, p = Responses(f), &compat.Responses
			case "/v1/chat/completions":
				h, p = chatChecker(), &compat.Chat
			default:
				t.Fatalf("a request to %s, which no translator serves", fx.Path)
			}
			var top map[string]json.RawMessage
			if err := json.Unmarshal(fx.Body, &top); err != nil {
				t.Fatal(err)
			}
			for k := range top {
				switch field, ok := p.Lookup(k); {
				case !ok:
					t.Errorf("%s sends %q, which the policy of %s does not classify", filepath.Base(file), k, p.Endpoint)
				case field.Treatment == compat.Refused:
					t.Errorf("%s sends %q, which the policy of %s refuses", filepath.Base(file), k, p.Endpoint)
				}
			}
			req := httptest.NewRequest(fx.Method, fx.Path, bytes.NewReader(fx.Body))
			for k, v := range fx.Header {
				req.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != http.StatusOK {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			t.Logf("%s: %s", compat.IgnoredHintsHeader, w.Header().Get(compat.IgnoredHintsHeader))
			if f.got != nil { // translated: the chat request passes the chat handler's checks
				chatBody, _ := json.Marshal(f.got)
				cw := httptest.NewRecorder()
				chatChecker().ServeHTTP(cw, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(chatBody)))
				if cw.Code != http.StatusOK {
					t.Errorf("the translated chat request is refused: %d %s", cw.Code, cw.Body)
				}
			}
		})
	}
}

// chatChecker decodes and checks a chat completion request as the agent does.
func chatChecker() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req runnerapi.ChatRequest
		b, _ := readBody(w, r)
		e := runnerapi.DecodeJSON(b, &req)
		if e == nil {
			_, e = req.Options()
		}
		if e == nil {
			e = req.Check()
		}
		if e != nil {
			writeJSON(w, e.Status, e)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
}
