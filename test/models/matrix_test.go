package models_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/standalone"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// maxEstimateRatio bounds the pool's estimate against the runner's measured peak
// footprint, both ways.
const maxEstimateRatio = 1.2

// matrixContext is each model's context: room for the prompts below and their
// answers, far past the tiny models' 32-token sliding window.
const matrixContext = 1024

// answerTokens is the length of every greedy answer compared.
const answerTokens = 12

var (
	// prompt runs past the prompt cache's 64-token blocks and the sliding window.
	prompt = strings.Repeat("A story about caches, windows and the states that models keep. ", 6)
	// other is a different prompt, asked between two of prompt's so that the slot
	// no longer holds prompt's state.
	other = strings.Repeat("Quite another question on an unrelated topic, asked meanwhile. ", 6)
	// long fills most of the context: every micro-batch of its prefill full, the
	// footprint at its peak.
	long = strings.Repeat("Every block of the batch is full and the attention mask at its widest. ", 16)
)

// gaps are the paths a family is served without, by path, with what it does instead.
// Their hit counts are logged, not asserted; their answers are still compared.
var gaps = map[ggufsynth.Family]map[string]string{
	// A restore cuts a saved state back to a prefix, which a recurrent state cannot
	// be: the runner serves the hybrid without its prompt cache and says so in its
	// /status (TestStatePathsOff asserts the reason).
	ggufsynth.Qwen3Next: {
		"cache": "off: every request prefills in full (the runner's /status names the recurrent state)",
	},
}

// templates are the families' own chat templates where the module ships one (read
// from it at run time); the others keep ggufsynth's chatml.
var templates = map[ggufsynth.Family]string{ggufsynth.Gemma3: "gemma3-instruct"}

// row is what one family's run measured.
type row struct {
	estimate, peak int64
	// registered is the estimate the pool holds (no row configures its memory).
	registered int64
	// first and again are the uncached model's answers to prompt, otherAnswer its
	// answer to other.
	first, again, otherAnswer answer
	// cold, hit and second are the cached model's: the first, prompt repeated at
	// once, and prompt repeated after other.
	cold, hit, second answer
	cache             *enginepool.PromptCacheStats
	// chat is how the runner renders the model's prompts.
	chat *runnerapi.ChatInfo
	// pid is the uncached model's runner, unload its unload's report.
	pid    int
	unload *enginepool.UnloadReport
}

// TestModelMatrix serves a tiny model of every family through `macfleet serve` and
// checks each path as a user reaches it: the load, with the pool's estimate against
// the runner's measured peak; a greedy stream answered alike twice (and differently
// to another prompt, so that the comparison can fail); a prompt-cache hit, at once
// and after another prompt, continuing as the full prefill did; an unload that frees
// memory.
func TestModelMatrix(t *testing.T) {
	runner := os.Getenv(runnerproc.RunnerEnv)
	if runner == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	dir := t.TempDir()
	var models []config.Model
	for _, f := range ggufsynth.Families {
		spec, err := ggufsynth.TinyFamily(f)
		if err != nil {
			t.Fatal(err)
		}
		if name := templates[f]; name != "" {
			tmpl, err := testassets.Find(name)
			if err != nil {
				t.Fatal(err)
			}
			spec.ChatTemplate = tmpl.Source
		}
		path := filepath.Join(dir, f.Arch()+".gguf")
		if err := ggufsynth.Write(path, spec); err != nil {
			t.Fatal(err)
		}
		set := engine.Settings{ContextLength: matrixContext}
		models = append(models,
			config.Model{Name: f.Arch(), Path: path, Settings: set, Residency: config.ResidencyOnDemand},
			config.Model{Name: f.Arch() + "-uncached", Path: path, Settings: set, Residency: config.ResidencyOnDemand,
				PromptCache: &config.PromptCache{Enabled: ptr.To(false)}})
	}
	hot := config.Size(64 << 20)
	cfg, err := config.Config{Runner: runner, RunnerThreads: 1, MemoryCeiling: 2 << 30, Listen: "127.0.0.1:0",
		PromptCacheDir: filepath.Join(dir, "prompt-cache"), PromptCacheHotBytes: &hot, Models: models}.Complete()
	if err != nil {
		t.Fatal(err)
	}
	s := serve(t, cfg)
	cold := map[ggufsynth.Family]answer{}
	for _, f := range ggufsynth.Families {
		t.Run(f.Arch(), func(t *testing.T) {
			s.t = t
			r := run(s, f)
			check(t, f, r)
			cold[f] = r.cold
		})
	}
	// A restarted agent finds the states its predecessor wrote to the SSD.
	s.stop()
	s = serve(t, cfg)
	for _, f := range ggufsynth.Families {
		t.Run(f.Arch()+"-after-restart", func(t *testing.T) {
			s.t = t
			checkRestart(t, f, s, cold[f])
		})
	}
}

// checkRestart asks family f's cached model, in a restarted agent, what its cold run
// answered: an SSD hit that answers alike.
func checkRestart(t *testing.T, f ggufsynth.Family, s *serving, cold answer) {
	a := s.stream(f.Arch(), prompt, answerTokens)
	pc := s.model(f.Arch()).PromptCache
	s.action(f.Arch(), "unload?wait=true")
	t.Logf("%s after a restart: %q (cached %d), first run's %q; prompt cache %+v", f, a.bytes, a.cached, cold.bytes, pc)
	if a.bytes != cold.bytes {
		t.Errorf("answer after the restart %q (cached %d), want the first run's full prefill's %q", a.bytes, a.cached, cold.bytes)
	}
	if gaps[f]["cache"] == "" && (a.cached <= 0 || pc == nil || pc.Hits < 1 || pc.HotHits != 0 || pc.Restores < 1) {
		t.Errorf("cached tokens %d, prompt cache %+v: want an SSD hit restored", a.cached, pc)
	}
}

// run takes family f's two models through every path, one loaded at a time.
func run(s *serving, f ggufsynth.Family) row {
	var r row
	name, uncached := f.Arch(), f.Arch()+"-uncached"

	got := s.action(uncached, "load")
	if got.State != enginepool.StateReady || got.Status == nil || got.Status.PID == 0 {
		s.t.Fatalf("load %s: %+v, want Ready with a runner", uncached, got)
	}
	r.pid = got.Status.PID
	r.first = s.stream(uncached, prompt, answerTokens)
	r.again = s.stream(uncached, prompt, answerTokens)
	r.otherAnswer = s.stream(uncached, other, answerTokens)
	s.stream(uncached, long, 1)
	after := time.Now()
	waitFor(s.t, "a footprint measured after the long prompt and the runner's chat report", 10*time.Second, func() bool {
		st := s.status()
		for _, m := range st.Models {
			if m.Name == uncached {
				return st.LastPoll.After(after) && m.Chat != nil
			}
		}
		return false
	})
	m := s.model(uncached)
	spec, err := standalone.BuildSpec(s.t.Context(), config.Model{Name: uncached, Path: m.Spec.Path,
		Settings: engine.Settings{ContextLength: matrixContext}})
	if err != nil {
		s.t.Fatal(err)
	}
	r.estimate, r.peak, r.registered, r.chat = spec.EstimatedBytes, m.PeakBytes, m.EstimatedBytes, m.Chat
	r.unload = s.action(uncached, "unload?wait=true").LastUnload

	s.action(name, "load")
	r.cold = s.stream(name, prompt, answerTokens)
	r.hit = s.stream(name, prompt, answerTokens)
	s.stream(name, other, answerTokens)
	r.second = s.stream(name, prompt, answerTokens)
	r.cache = s.model(name).PromptCache
	if gaps[f]["cache"] == "" {
		waitFor(s.t, "the state to be persisted on the SSD", 30*time.Second, func() bool {
			pc := s.model(name).PromptCache
			return pc != nil && pc.SavesPersisted >= 1
		})
	}
	s.action(name, "unload?wait=true")
	return r
}

// check asserts family f's row, but for its gaps, which it logs.
func check(t *testing.T, f ggufsynth.Family, r row) {
	ratio := float64(r.estimate) / float64(r.peak)
	t.Logf("%s: estimate %d KiB, measured peak %d KiB (%.2fx); answers %q, again %q (cached %d), to another prompt %q; "+
		"cached model: cold %q, repeated %q (cached %d), after another prompt %q (cached %d), prompt cache %+v; unload %+v",
		f, r.estimate>>10, r.peak>>10, ratio, r.first.bytes, r.again.bytes, r.again.cached, r.otherAnswer.bytes,
		r.cold.bytes, r.hit.bytes, r.hit.cached, r.second.bytes, r.second.cached, r.cache, r.unload)
	if r.chat == nil || r.chat.Renderer != runnerapi.RendererJinja || r.chat.TemplateError != "" {
		t.Errorf("chat rendering %+v, want the model's own Jinja template", r.chat)
	}
	gap := gaps[f]
	for path, what := range gap {
		t.Logf("known gap, %s: %s", path, what)
	}
	onCard := r.unload != nil && r.unload.DeviceFreedBytes > 0
	if gap["estimate"] == "" && onCard {
		// The model is on a card with memory of its own and the host holds the GPU
		// runtime (400-500 MiB whatever the model): neither side measures the model
		// alone. The estimate is checked where memory is unified (a Mac, the CPU).
		t.Logf("on a card (%d bytes freed there): the estimate is not compared with the host peak, the runtime's", r.unload.DeviceFreedBytes)
	}
	if gap["estimate"] == "" && !onCard {
		if ratio > maxEstimateRatio || ratio < 1/maxEstimateRatio {
			t.Errorf("estimate %d is %.2f times the measured peak %d, want within %.1fx", r.estimate, ratio, r.peak, maxEstimateRatio)
		}
		if r.registered != r.estimate {
			t.Errorf("the pool holds the estimate %d, BuildSpec gives %d", r.registered, r.estimate)
		}
	}
	if r.first.bytes != r.again.bytes {
		t.Errorf("greedy answers %q then %q, want the same tokens", r.first.bytes, r.again.bytes)
	}
	if r.otherAnswer.bytes == r.first.bytes {
		t.Errorf("another prompt got the same answer %q: the model ignores its prompt, and no comparison can fail", r.first.bytes)
	}
	if r.cold.bytes != r.first.bytes {
		t.Errorf("the cached model's cold answer %q, the uncached one's %q", r.cold.bytes, r.first.bytes)
	}
	if r.cold.cached != 0 {
		t.Errorf("the first request reported %d cached tokens, want 0", r.cold.cached)
	}
	// Whether or not the cache served them, the answers are the full prefill's.
	if r.hit.bytes != r.cold.bytes || r.second.bytes != r.cold.bytes {
		t.Errorf("answers after cache hits %q (cached %d) and %q (cached %d), want the full prefill's %q",
			r.hit.bytes, r.hit.cached, r.second.bytes, r.second.cached, r.cold.bytes)
	}
	if gap["cache"] == "" && (r.hit.cached <= 0 || r.second.cached <= 0 || r.cache == nil || r.cache.Restores < 1) {
		t.Errorf("cached tokens %d and %d, prompt cache %+v: want both repeats served from the cache, the second restored",
			r.hit.cached, r.second.cached, r.cache)
	}
	// The freed bytes are the host gauge's drop, which other processes move: the
	// runner's footprint and its end are what the row can hold to.
	if u := r.unload; u == nil || u.Reason != enginepool.ReasonAdmin || u.FreedBytes < 0 || u.ResidentBytes <= 0 || u.Outcome == "" {
		t.Errorf("unload report %+v, want the admin's with its outcome, the runner's footprint and the bytes freed", u)
	}
	if err := syscall.Kill(r.pid, 0); err != syscall.ESRCH {
		t.Errorf("runner %d after the unload: kill(0) = %v, want ESRCH", r.pid, err)
	}
}
