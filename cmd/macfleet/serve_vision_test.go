package main

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/macfleet/macfleet/test/support/visiontest"
)

// TestServeAnswersImages: `macfleet serve --projector hf://…` pulls the projector
// from the hub and serves the model with it: an image question counts the image's
// tokens; the same picture by URL (a host the --source-policy lists) is fetched, put
// inline and is a prompt-cache hit of the data URI's; a host it does not list is a
// 400 naming the rule.
func TestServeAnswersImages(t *testing.T) {
	runner := runnerOrSkip(t)
	dir := t.TempDir()
	model, mmproj := filepath.Join(dir, "gemma3.gguf"), filepath.Join(dir, "mmproj.gguf")
	proj := visiontest.WriteModel(t, model, mmproj)
	hub := newHubDoubleFiles(t, "hf_tok", map[string]string{"/org/g-GGUF/resolve/main/mmproj.gguf": mmproj})
	t.Setenv(hfTokenEnv, "hf_tok")
	pic := visiontest.PNG(t, visiontest.Gradient)
	images := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "image/png")
		_, _ = w.Write(pic)
	}))
	t.Cleanup(images.Close)
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(`apiVersion: macfleet.dev/v1alpha1
kind: SourcePolicy
metadata:
  name: default
spec:
  rules:
  - namespaces: ["serve"]
    registries: [hf]
    hosts: ["127.0.0.1"]
    allowPlainHTTP: true
  allowedNetworks: ["127.0.0.0/8"]
`), 0o600); err != nil {
		t.Fatal(err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := newServeCommand()
	cmd.SetArgs([]string{"--model", "v=" + model + ":ctx=512,parallel=1", "--projector", "hf://org/g-GGUF/mmproj.gguf",
		"--listen", addr, "--store-dir", t.TempDir(), "--hf-endpoint", hub.URL, "--source-policy", policy,
		"--prompt-cache-dir", t.TempDir(), "--runner", runner, "--runner-threads", "1"})
	defer runServe(t, cmd, addr)()
	c := openai.NewClient(option.WithBaseURL("http://"+addr+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ask := func(img string) visiontest.Answer {
		return visiontest.Ask(t, c, visiontest.ChatParams("v", visiontest.Question, img, 6))
	}

	text, first, byURL := ask(""), ask(visiontest.DataURI(pic)), ask(images.URL+"/a.png")
	if first.Prompt-text.Prompt < int64(proj.ImageTokens()) {
		t.Errorf("%d prompt tokens with the image, %d without: want at least the image's %d more", first.Prompt, text.Prompt, proj.ImageTokens())
	}
	if byURL.Prompt != first.Prompt || byURL.Cached != byURL.Prompt-1 || byURL.Text != first.Text {
		t.Errorf("the picture by URL %+v, as a data URI %+v: want the same prompt, all but its last token cached, the same answer", byURL, first)
	}
	t.Logf("prompt tokens: text %d, image %d (by URL %d, %d cached); answers %q, %q", text.Prompt, first.Prompt, byURL.Prompt, byURL.Cached,
		first.Text, byURL.Text)
	_, err = c.Chat.Completions.New(t.Context(), visiontest.ChatParams("v", visiontest.Question, strings.Replace(images.URL, "127.0.0.1", "localhost", 1)+"/a.png", 6))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusBadRequest || !strings.Contains(apiErr.RawJSON(), `source host \"localhost\" is not allowed for namespace \"serve\"`) {
		t.Errorf("an image on a host the policy does not list: %v, want a 400 naming the host", err)
	}
	if got := strings.Join(hub.requests(), "\n"); got != "GET /org/g-GGUF/resolve/main/mmproj.gguf Bearer hf_tok" {
		t.Errorf("the hub saw %q, want one GET of the projector", got)
	}
}
