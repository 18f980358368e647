package runnerproc

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/metal/enginepool"
)

func TestPromptCacheModelID(t *testing.T) {
	const digest = "sha256-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	if got := PromptCacheModelID("/store/blobs/" + digest); got != digest {
		t.Errorf("a store blob: %q, want its digest name", got)
	}
	a, b := PromptCacheModelID("/models/qwen 7b.Q4.gguf"), PromptCacheModelID("/other/qwen 7b.Q4.gguf")
	if !strings.HasPrefix(a, "qwen_7b.Q4-") || a == b {
		t.Errorf("path ids %q and %q: want the sanitized name and a hash of the path, different per path", a, b)
	}
	if again := PromptCacheModelID("/models/qwen 7b.Q4.gguf"); again != a {
		t.Errorf("the id of one path changed: %q then %q", a, again)
	}
	if got := PromptCacheModelID("/m/.hidden.gguf"); strings.HasPrefix(got, ".") {
		t.Errorf("an id starting with a dot: %q", got)
	}
	if got := PromptCacheModelID("/m/sha256-XYZ"); got == "sha256-XYZ" {
		t.Errorf("a file merely named sha256-… is taken for a digest: %q", got)
	}
}

// The SSD quota a runner gets: the model's, bounded by the agent's; a tier that
// either turns off is off.
func TestPromptCacheArgs(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.gguf")
	base := filepath.Join(dir, "pc", PromptCacheDirName("", model))
	for _, tc := range []struct {
		name     string
		cacheDir string
		agentSSD int64
		pc       enginepool.PromptCacheSpec
		want     []string
	}{
		{"disabled", dir + "/pc", 1 << 30, enginepool.PromptCacheSpec{}, nil},
		{"agent quota", dir + "/pc", 1 << 30, enginepool.PromptCacheSpec{Enabled: true},
			[]string{"--prompt-cache-dir", base, "--prompt-cache-ssd-bytes", "1073741824"}},
		{"smaller model quota", dir + "/pc", 1 << 30, enginepool.PromptCacheSpec{Enabled: true, SSDBytes: 1 << 20},
			[]string{"--prompt-cache-dir", base, "--prompt-cache-ssd-bytes", "1048576"}},
		{"larger model quota is bounded", dir + "/pc", 1 << 30, enginepool.PromptCacheSpec{Enabled: true, SSDBytes: 1 << 40},
			[]string{"--prompt-cache-dir", base, "--prompt-cache-ssd-bytes", "1073741824"}},
		{"model turns the SSD tier off", dir + "/pc", 1 << 30, enginepool.PromptCacheSpec{Enabled: true, SSDBytes: -1}, nil},
		{"agent turns it off", dir + "/pc", 0, enginepool.PromptCacheSpec{Enabled: true}, nil},
		{"no directory", "", 1 << 30, enginepool.PromptCacheSpec{Enabled: true}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := NewProcessFactory(ProcessConfig{PromptCacheDir: tc.cacheDir, PromptCacheSSDBytes: tc.agentSSD})
			spec := enginepool.ModelSpec{Name: "m", Path: model, PromptCache: tc.pc}
			d := f.claimCacheDir(spec)
			defer f.releaseCacheDir(d)
			if d2 := f.claimCacheDir(spec); d2 != d {
				t.Errorf("a second runner of the file got %q, want the first one's %q (one directory per namespace and file)", d2, d)
			} else {
				f.releaseCacheDir(d2)
			}
			if got := f.promptCacheArgs(spec, d); !cmp.Equal(tc.want, got) {
				t.Errorf("args (-want +got):\n%s", cmp.Diff(tc.want, got))
			}
		})
	}
}

// Runners of one model file share its directory, held while one of them runs; the
// prompt cache flags are in the adoption fingerprint.
func TestPromptCacheDirsOfRealRunners(t *testing.T) {
	env := newAdoptEnv(t)
	pcDir := t.TempDir()
	withCache := func(ssd int64) func(*ProcessConfig) {
		return func(c *ProcessConfig) { c.PromptCacheDir, c.PromptCacheSSDBytes = pcDir, ssd }
	}
	spec := env.spec()
	spec.PromptCache = enginepool.PromptCacheSpec{Enabled: true}
	base := filepath.Join(pcDir, PromptCacheDirName("", env.model))

	f := env.factory(withCache(1 << 30))
	r1 := adoptStart(t, f, spec)
	spec2 := spec
	spec2.Name = "tiny-2"
	r2 := adoptStart(t, f, spec2)
	if r1.cacheDir != base || r2.cacheDir != base {
		t.Fatalf("cache dirs %q and %q, want both %q", r1.cacheDir, r2.cacheDir, base)
	}
	for _, r := range []*ProcessRunner{r1, r2} {
		var st enginepool.RunnerStatus
		procGetJSON(t, r, "/status", &st)
		if st.PromptCache == nil || !strings.HasPrefix(st.PromptCache.Dir, base+string(filepath.Separator)) ||
			st.PromptCache.SSD == nil {
			t.Fatalf("runner's prompt cache %+v, want an SSD tier under %s", st.PromptCache, base)
		}
	}
	if err := r2.Stop(t.Context(), time.Second); err != nil {
		t.Fatal(err)
	}
	if f.holdCacheDirForPrune(base) {
		t.Error("the janitor could take the directory while the first runner still holds it")
	}
	if got := f.claimCacheDir(spec2); got != base {
		t.Errorf("after the second runner exited the next claim got %q, want %q", got, base)
	}

	// Detached, then a factory with another SSD quota: not adopted (the flags differ).
	if !r1.Detach() {
		t.Fatal("Detach = false")
	}
	other := adoptStart(t, env.factory(withCache(2<<30)), spec)
	if other.Adopted() {
		t.Fatal("a runner with other prompt cache flags was adopted")
	}
	if other.cacheDir != base {
		t.Errorf("the new factory's runner got %q, want %q, which it shares with the detached runner", other.cacheDir, base)
	}
	if err := other.Stop(t.Context(), time.Second); err != nil {
		t.Fatal(err)
	}
	same := adoptStart(t, env.factory(withCache(1<<30)), spec)
	if !same.Adopted() || same.PID() != r1.PID() || same.cacheDir != base {
		t.Fatalf("same flags: adopted %v pid %d dir %q; want pid %d adopted with %q", same.Adopted(), same.PID(), same.cacheDir, r1.PID(), base)
	}
	if err := same.Stop(t.Context(), time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestAdoptionKeepsEachRunnersCacheDir: two runners of one file share <id>; the next
// agent starts their models in the other order and still adopts both with it, and a
// third runner of the file shares it too.
func TestAdoptionKeepsEachRunnersCacheDir(t *testing.T) {
	env := newAdoptEnv(t)
	pcDir := t.TempDir()
	withCache := func(c *ProcessConfig) { c.PromptCacheDir, c.PromptCacheSSDBytes = pcDir, 1<<30 }
	spec := env.spec()
	spec.PromptCache = enginepool.PromptCacheSpec{Enabled: true}
	spec2 := spec
	spec2.Name = "tiny-2"
	base := filepath.Join(pcDir, PromptCacheDirName("", env.model))

	f := env.factory(withCache)
	r1, r2 := adoptStart(t, f, spec), adoptStart(t, f, spec2)
	if r1.cacheDir != base || r2.cacheDir != base {
		t.Fatalf("cache dirs %q and %q, want both %q", r1.cacheDir, r2.cacheDir, base)
	}
	if !r1.Detach() || !r2.Detach() {
		t.Fatal("Detach = false")
	}

	next := env.factory(withCache)
	a2, a1 := adoptStart(t, next, spec2), adoptStart(t, next, spec)
	for _, c := range []struct {
		name     string
		got, was *ProcessRunner
		dir      string
	}{{"tiny-2", a2, r2, base}, {"tiny", a1, r1, base}} {
		if !c.got.Adopted() || c.got.PID() != c.was.PID() || c.got.cacheDir != c.dir {
			t.Errorf("%s: adopted %v pid %d dir %q; want pid %d adopted with %q", c.name, c.got.Adopted(), c.got.PID(),
				c.got.cacheDir, c.was.PID(), c.dir)
		}
	}
	// A third runner of the file shares it.
	spec3 := spec
	spec3.Name = "tiny-3"
	if got := next.claimCacheDir(spec3); got != base {
		t.Errorf("a third runner's directory %q, want %q", got, base)
	}
	for _, r := range []*ProcessRunner{a1, a2} {
		if err := r.Stop(t.Context(), time.Second); err != nil {
			t.Error(err)
		}
	}
}
