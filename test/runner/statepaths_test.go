package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// familyModel synthesizes ggufsynth's tiny model of family f once per test binary and
// returns its path.
func familyModel(t testing.TB, f ggufsynth.Family) string {
	t.Helper()
	modelsMu.Lock()
	defer modelsMu.Unlock()
	name := "family-" + f.Arch()
	if p, ok := modelsByName[name]; ok {
		return p
	}
	spec, err := ggufsynth.TinyFamily(f)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(modelDir, name+".gguf")
	if err := ggufsynth.Write(p, spec); err != nil {
		t.Fatal(err)
	}
	modelsByName[name] = p
	return p
}

// TestPromptCacheOffForRecurrentState: a hybrid model (qwen3next: gated delta-net
// layers keep a recurrent state, which cannot be cut back to a prefix) is served
// without its prompt cache, and the runner says why in /status; it saves no state,
// refuses peers' states and budgets with that reason, and answers every turn as a
// full prefill does. A model of attention cells (llama) keeps its cache and reports
// no path off.
func TestPromptCacheOffForRecurrentState(t *testing.T) {
	cacheFlags := func(dir string) []string {
		return []string{"--prompt-cache-block", fmt.Sprint(pcBlock), "--prompt-cache-hot-bytes", fmt.Sprint(64 << 20),
			"--prompt-cache-dir", dir}
	}
	t.Run("llama", func(t *testing.T) {
		r := startReady(t, familyModel(t, ggufsynth.Llama), cacheFlags(t.TempDir())...)
		if st := r.status(); len(st.Off) != 0 || st.PromptCache == nil {
			t.Errorf("/status off %+v, prompt cache %+v: want no path off and the cache's report", st.Off, st.PromptCache)
		}
	})
	t.Run("qwen3next", func(t *testing.T) {
		m := familyModel(t, ggufsynth.Qwen3Next)
		conv := &conversation{users: []string{words(1, 120), words(2, 60)}}
		base := startReady(t, m)
		for turn := range conv.users {
			clearCache(t, base)
			reply, _ := chatTurn(t, base, conv.messages(turn), pcMaxTokens)
			conv.replies = append(conv.replies, reply)
		}
		base.stop()

		dir := filepath.Join(t.TempDir(), "prompt-cache")
		r := startReady(t, m, cacheFlags(dir)...)
		st := r.status()
		want := []runnerapi.PathOff{{Path: runnerapi.PathPromptCache,
			Reason: "off: the model keeps a recurrent state beside its attention cache, which cannot be cut back to a prefix (qwen3next)"},
			{Path: runnerapi.PathSpeculation,
				Reason: "off: the model keeps a recurrent state beside its attention cache, which cannot be cut back past a rejected draft (qwen3next)"}}
		if diff := cmp.Diff(want, st.Off); diff != "" || st.PromptCache != nil {
			t.Errorf("/status off (-want +got):\n%s\nprompt cache %+v (want none)", diff, st.PromptCache)
		}
		// Each turn twice: a repeat after the slot moved on, and at once.
		for _, turn := range []int{0, 1, 0, 0, 1} {
			if reply, u := chatTurn(t, r, conv.messages(turn), pcMaxTokens); reply != conv.replies[turn] {
				t.Errorf("turn %d reply %q (cached %d), full prefill gave %q", turn, reply, cachedTokens(u), conv.replies[turn])
			}
		}
		if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
			t.Errorf("the runner wrote %d entries under the prompt cache directory, want none", len(entries))
		}
		var res runnerapi.PeerStateResult
		if code := r.postJSON("/cache/states", "", &res); code != http.StatusConflict ||
			res.Reason != runnerapi.PeerMissDisabled || !strings.Contains(res.Detail, want[0].Reason) {
			t.Errorf("POST /cache/states: %d %+v, want 409 %s naming %q", code, res, runnerapi.PeerMissDisabled, want[0].Reason)
		}
		var e runnerapi.ErrorBody
		if code := r.postJSON("/cache/budget", map[string]any{"hot_bytes": 1 << 20}, &e); code != http.StatusConflict ||
			!strings.Contains(e.Error.Message, want[0].Reason) {
			t.Errorf("POST /cache/budget: %d %+v, want 409 naming %q", code, e, want[0].Reason)
		}
	})
}
