package models_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/syncbuf"
)

// pathsOff are the paths a family's runner serves it without, with the reason its
// /status gives; a family not named serves every path.
var pathsOff = map[ggufsynth.Family][]runnerapi.PathOff{
	// A restore keeps a saved state's first tokens and cuts the rest; a recurrent
	// state exists only at its sequence's last position and cannot be cut back.
	ggufsynth.Qwen3Next: {{Path: runnerapi.PathPromptCache,
		Reason: "off: the model keeps a recurrent state beside its attention cache, which cannot be cut back to a prefix (qwen3next)"},
		{Path: runnerapi.PathSpeculation,
			Reason: "off: the model keeps a recurrent state beside its attention cache, which cannot be cut back past a rejected draft (qwen3next)"}},
}

// TestStatePathsOff starts each family's runner with a prompt cache and checks the
// paths its /status reports off against pathsOff, and that its greedy answers (prompt,
// prompt again at once, and after another prompt) are those of a runner without a
// cache, whether the cache served them or was off.
func TestStatePathsOff(t *testing.T) {
	eachFamily(t, func(t *testing.T, bin string, m tinyModel) {
		f, path, dir := m.family, m.path, m.dir
		plain := startRunner(t, bin, path)
		want := []string{plain.greedy(prompt), plain.greedy(other)}
		plain.stop()

		cached := startRunner(t, bin, path, "--prompt-cache-hot-bytes", fmt.Sprint(64<<20),
			"--prompt-cache-dir", filepath.Join(dir, f.Arch()+"-cache"))
		st := cached.status()
		if diff := cmp.Diff(pathsOff[f], st.Off); diff != "" {
			t.Errorf("/status off (-want +got):\n%s", diff)
		}
		if (st.PromptCache == nil) != (len(pathsOff[f]) > 0) {
			t.Errorf("/status prompt cache %+v with paths off %+v: want a report exactly when the cache is on", st.PromptCache, st.Off)
		}
		got := []string{cached.greedy(prompt), cached.greedy(prompt), cached.greedy(other), cached.greedy(prompt)}
		if diff := cmp.Diff([]string{want[0], want[0], want[1], want[0]}, got); diff != "" {
			t.Errorf("answers with the prompt cache (-uncached +cached):\n%s", diff)
		}
		t.Logf("%s: off %+v; answers %q", f, st.Off, got)
	})
}

// modelRunner is one runner process on a loopback port, stopped at the test's end.
type modelRunner struct {
	t      *testing.T
	cmd    *exec.Cmd
	base   string
	stderr *syncbuf.Buffer
}

// startRunner starts bin on model with flags and waits until it has loaded it.
func startRunner(t *testing.T, bin, model string, flags ...string) *modelRunner {
	t.Helper()
	args := append([]string{"--model", model, "--threads", "1", "--addr", "127.0.0.1:0"}, flags...)
	r := &modelRunner{t: t, cmd: exec.Command(bin, args...), stderr: &syncbuf.Buffer{}}
	r.cmd.Stderr = r.stderr
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.stop)
	sc := bufio.NewScanner(stdout)
	var ev runnerapi.ListeningEvent
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Addr == "" {
		t.Fatalf("runner did not announce a loopback listener (%q); stderr:\n%s", sc.Text(), r.stderr.String())
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	r.base = "http://" + ev.Addr
	waitFor(t, "the runner to load its model", time.Minute, func() bool {
		var h runnerapi.Health
		if err := r.get("/health", &h); err == nil && h.Status == runnerapi.StateFailed {
			t.Fatalf("runner failed to load: %s; stderr:\n%s", h.Error, r.stderr.String())
		}
		return h.Status == runnerapi.StateReady
	})
	return r
}

func (r *modelRunner) stop() {
	if r.cmd.ProcessState != nil {
		return
	}
	_ = r.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		<-done
	}
	if r.t.Failed() {
		r.t.Logf("runner stderr:\n%s", r.stderr.String())
	}
}

func (r *modelRunner) get(path string, v any) error {
	resp, err := http.Get(r.base + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

func (r *modelRunner) status() runnerapi.Status {
	r.t.Helper()
	var st runnerapi.Status
	if err := r.get("/status", &st); err != nil {
		r.t.Fatalf("GET /status: %v", err)
	}
	return st
}

// greedy is the bytes of the runner's greedy answer of answerTokens tokens to text
// (random weights often answer with byte tokens that are not UTF-8).
func (r *modelRunner) greedy(text string) string {
	r.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "test", "temperature": 0, "max_tokens": answerTokens, "logprobs": true,
		"messages": []map[string]string{{"role": "user", "content": text}}})
	resp, err := http.Post(r.base+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	var c runnerapi.ChatCompletion
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != http.StatusOK || len(c.Choices) != 1 ||
		c.Choices[0].Logprobs == nil {
		r.t.Fatalf("chat: %d %+v %v", resp.StatusCode, c, err)
	}
	var out []byte
	for _, lp := range c.Choices[0].Logprobs.Content {
		for _, b := range lp.Bytes {
			out = append(out, byte(b))
		}
	}
	if len(out) == 0 {
		r.t.Fatalf("chat: an answer without its tokens' bytes: %+v", c)
	}
	return string(out)
}
