// Package models_test is the model matrix: a model of each family ggufsynth writes,
// served by the standalone agent (`macfleet serve`) on the real runner, through every
// path a user reaches with the official OpenAI client.
package models_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/agent/standalone"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// logBuffer collects the agent's log lines from several goroutines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) line(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintln(&l.b, prefix, args)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// pollInterval is how often the pool measures the runners' footprints here.
const pollInterval = 50 * time.Millisecond

// serving is one standalone.Run in the background, stopped at the test's end.
type serving struct {
	t      *testing.T
	base   string
	logs   *logBuffer
	client openai.Client
	// stop ends the agent (at the test's end if not before).
	stop func()
}

func serve(t *testing.T, cfg config.Config) *serving {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &serving{t: t, base: "http://" + ln.Addr().String(), logs: &logBuffer{}}
	s.client = openai.NewClient(option.WithBaseURL(s.base+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- standalone.Run(ctx, cfg, standalone.Options{Log: funcr.New(s.logs.line, funcr.Options{}), Listener: ln,
			Pool: enginepool.Config{DrainTimeout: time.Second, SettleTimeout: time.Second, PollActive: pollInterval, PollIdle: pollInterval}})
	}()
	stopped := false
	s.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Errorf("Run did not return:\n%s", s.logs.String())
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", s.logs.String())
		}
	}
	t.Cleanup(s.stop)
	waitFor(t, "the agent to be ready", time.Minute, func() bool {
		resp, err := http.Get(s.base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return s
}

// action posts an admin action (load, unload?wait=true) on a model.
func (s *serving) action(model, what string) server.ModelActionResponse {
	s.t.Helper()
	resp, err := http.Post(s.base+"/api/models/"+model+"/"+what, "application/json", nil)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out server.ModelActionResponse
	if err := json.Unmarshal(b, &out); resp.StatusCode != http.StatusOK || err != nil {
		s.t.Fatalf("%s %s: %d %s", what, model, resp.StatusCode, b)
	}
	return out
}

// status is /api/status.
func (s *serving) status() server.StatusResponse {
	s.t.Helper()
	resp, err := http.Get(s.base + "/api/status")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var st server.StatusResponse
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		s.t.Fatal(err)
	}
	return st
}

// model is the model's entry of /api/status.
func (s *serving) model(name string) enginepool.ModelSnapshot {
	s.t.Helper()
	for _, m := range s.status().Models {
		if m.Name == name {
			return m
		}
	}
	s.t.Fatalf("no model %s in the status", name)
	return enginepool.ModelSnapshot{}
}

// answer is a streamed greedy answer: its text, the bytes of its tokens (random
// weights often answer with byte tokens that are not UTF-8, which the text shows
// alike as U+FFFD), and the prompt tokens the runner reported as cached.
type answer struct {
	text, bytes string
	cached      int64
	prompt      int64
}

// stream asks model for a greedy streamed answer of at most maxTokens to prompt.
func (s *serving) stream(model, prompt string, maxTokens int64) answer {
	s.t.Helper()
	st := s.client.Chat.Completions.NewStreaming(s.t.Context(), openai.ChatCompletionNewParams{
		Model:         model,
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
		MaxTokens:     openai.Int(maxTokens),
		Temperature:   openai.Float(0),
		Logprobs:      openai.Bool(true),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var a answer
	for st.Next() {
		c := st.Current()
		for _, ch := range c.Choices {
			a.text += ch.Delta.Content
			for _, lp := range ch.Logprobs.Content {
				for _, b := range lp.Bytes {
					a.bytes += string(rune(b))
				}
			}
		}
		if c.Usage.PromptTokens > 0 {
			a.prompt, a.cached = c.Usage.PromptTokens, c.Usage.PromptTokensDetails.CachedTokens
		}
	}
	if err := st.Err(); err != nil {
		s.t.Fatalf("stream from %s: %v", model, err)
	}
	if a.prompt == 0 || a.bytes == "" {
		s.t.Fatalf("stream from %s ended without usage or without its tokens' bytes (%+v)", model, a)
	}
	return a
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tinyModel is one family's tiny model written for a test: its spec, its file and a
// folder beside it for the test's other files.
type tinyModel struct {
	family    ggufsynth.Family
	spec      ggufsynth.Spec
	path, dir string
}

// eachFamily runs check as a subtest for the tiny model of each family, bin the
// runner; it skips without one.
func eachFamily(t *testing.T, check func(t *testing.T, bin string, m tinyModel)) {
	bin := os.Getenv(runnerproc.RunnerEnv)
	if bin == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	dir := t.TempDir()
	for _, f := range ggufsynth.Families {
		t.Run(f.Arch(), func(t *testing.T) {
			spec, err := ggufsynth.TinyFamily(f)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, f.Arch()+".gguf")
			if err := ggufsynth.Write(path, spec); err != nil {
				t.Fatal(err)
			}
			check(t, bin, tinyModel{family: f, spec: spec, path: path, dir: dir})
		})
	}
}
