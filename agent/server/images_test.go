package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"testing"

	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/internal/imagefetch"
)

// TestInlineImagesHook: a chat request's images are put inline before anything else
// sees it, for the namespace of the deployment that serves the model; a refusal is a
// 400 naming the part, and a request for a model that does not resolve is not
// fetched for (it is answered as before).
func TestInlineImagesHook(t *testing.T) {
	var mu sync.Mutex
	var namespaces []string
	inline := func(_ context.Context, namespace string, body []byte) ([]byte, error) {
		mu.Lock()
		namespaces = append(namespaces, namespace)
		mu.Unlock()
		return nil, &imagefetch.Error{Param: "messages[0].content[1].image_url.url",
			Message: `the image URL may not be fetched: source host "x.example" is not allowed for namespace "team"`}
	}
	a := startAgent(t, agentOptions{noRunner: true, inlineImages: inline,
		resolveModel: func(_ *http.Request, model string) (string, error) {
			if model != "vision" {
				return "", errors.New("no such model")
			}
			return "tiny", nil
		},
		deploymentOf: func(entry string) string { return "team/" + entry }})
	body := map[string]any{"model": "vision", "messages": []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "text", "text": "What is it?"},
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": "https://x.example/a.png"}}}}}}
	resp, b := a.do(http.MethodPost, "/v1/chat/completions", body)
	var e struct {
		Error struct{ Message, Type, Param, Code string }
	}
	_ = json.Unmarshal(b, &e)
	if resp.StatusCode != http.StatusBadRequest || e.Error.Code != server.CodeInvalidImageURL ||
		e.Error.Param != "messages[0].content[1].image_url.url" || e.Error.Type != "invalid_request_error" {
		t.Errorf("%d %s, want a 400 %s naming the part", resp.StatusCode, b, server.CodeInvalidImageURL)
	}
	body["model"] = "unknown"
	if resp, b = a.do(http.MethodPost, "/v1/chat/completions", body); resp.StatusCode == http.StatusBadRequest && json.Unmarshal(b, &e) == nil &&
		e.Error.Code == server.CodeInvalidImageURL {
		t.Errorf("a request for a model that does not resolve was fetched for: %s", b)
	}
	// The Messages API reaches the same hook through its translation.
	resp, b = a.do(http.MethodPost, "/v1/messages", map[string]any{"model": "vision", "max_tokens": 5, "messages": []any{
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "image", "source": map[string]any{"type": "url", "url": "https://x.example/a.png"}}}}}})
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("messages: %d %s, want the 400", resp.StatusCode, b)
	}
	// count_tokens counts the images it fetched.
	resp, b = a.do(http.MethodPost, "/v1/messages/count_tokens", map[string]any{"model": "vision", "messages": []any{
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "image", "source": map[string]any{"type": "url", "url": "https://x.example/a.png"}}}}}})
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("count_tokens: %d %s, want the 400", resp.StatusCode, b)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(namespaces) != 3 || namespaces[0] != "team" || namespaces[1] != "team" || namespaces[2] != "team" {
		t.Errorf("inlined for namespaces %q, want team three times (the unknown model not at all)", namespaces)
	}
}
