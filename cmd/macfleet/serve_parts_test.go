package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// TestServePullsAModelStoredInParts: `macfleet serve --model NAME=hf://…-00001-of-00003.gguf`
// pulls the three parts of a model from the hub (a double on loopback), each once,
// and serves it with the runner sandbox on: the runner loads the parts from the first
// and answers what the same model in one file answers. The estimate counts every part.
func TestServePullsAModelStoredInParts(t *testing.T) {
	runner := runnerOrSkip(t)
	dir := t.TempDir()
	one := filepath.Join(dir, "tiny.gguf")
	if err := ggufsynth.Write(one, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	parts, err := ggufsynth.WriteParts(filepath.Join(dir, "tiny"), ggufsynth.Tiny(), 3)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, p := range parts {
		files["/org/tiny-GGUF/resolve/main/Q/"+filepath.Base(p)] = p
	}
	hub := newHubDoubleFiles(t, "hf_gated", files)
	t.Setenv(hfTokenEnv, "hf_gated")
	storeDir := t.TempDir()

	// Both runners are confined (the sandbox's default): the runner of the model in
	// parts is granted each part (metal/runner/sandbox, Policy.Parts).
	want := serveAndAsk(t, runner, one)
	got := serveAndAsk(t, runner, "hf://org/tiny-GGUF/Q/tiny-00001-of-00003.gguf",
		"--store-dir", storeDir, "--hf-endpoint", hub.URL, "--source-policy", loopbackPolicy(t))
	if got != want {
		t.Errorf("the model pulled in three parts answers %q, the one file %q", got, want)
	}
	var seen []string
	for _, r := range hub.requests() {
		seen = append(seen, strings.TrimSuffix(r, " Bearer hf_gated"))
	}
	wantSeen := []string{
		"GET /org/tiny-GGUF/resolve/main/Q/tiny-00001-of-00003.gguf",
		"GET /org/tiny-GGUF/resolve/main/Q/tiny-00002-of-00003.gguf",
		"GET /org/tiny-GGUF/resolve/main/Q/tiny-00003-of-00003.gguf",
	}
	if strings.Join(seen, "\n") != strings.Join(wantSeen, "\n") {
		t.Errorf("the hub saw %q; want one GET of each part with the token", hub.requests())
	}
}

// serveAndAsk runs serve on the model source with args, asks it one greedy question
// and stops it; it returns the answer.
func serveAndAsk(t *testing.T, runner, source string, args ...string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := newServeCommand()
	cmd.SetArgs(append([]string{"--model", "tiny=" + source + ":ctx=256,parallel=1", "--listen", addr,
		"--prompt-cache-dir", t.TempDir(), "--runner", runner, "--runner-threads", "1"}, args...))
	defer runServe(t, cmd, addr)()
	client := openai.NewClient(option.WithBaseURL("http://"+addr+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	cctx, ccancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer ccancel()
	resp, err := client.Chat.Completions.New(cctx, openai.ChatCompletionNewParams{Model: "tiny",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Name the parts")},
		MaxTokens:   openai.Int(12),
		Temperature: openai.Float(0)})
	if err != nil {
		t.Fatalf("a chat completion from %s: %v", source, err)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
		t.Fatalf("response %+v: want one choice with text", resp)
	}
	return resp.Choices[0].Message.Content
}
