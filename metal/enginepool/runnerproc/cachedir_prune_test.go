package runnerproc

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/macfleet/macfleet/metal/enginepool"
)

// lchtimes sets the times of a symbolic link itself.
func lchtimes(t *testing.T, path string, mtime time.Time) {
	t.Helper()
	tv := unix.NsecToTimeval(mtime.UnixNano())
	if err := unix.Lutimes(path, []unix.Timeval{tv, tv}); err != nil {
		t.Fatal(err)
	}
}

// cacheFiles writes a prompt cache directory at dir holding a state file of n bytes
// in an engine format subdirectory, everything modified at mtime.
func cacheFiles(t *testing.T, dir string, n int, mtime time.Time) {
	t.Helper()
	sub := filepath.Join(dir, "fmt-1")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(sub, "0123abcd.state")
	if err := os.WriteFile(state, make([]byte, n), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{state, sub, dir} {
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
}

func lsDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out
}

func TestPrunePromptCacheDirs(t *testing.T) {
	now := time.Now()
	const retention = 24 * time.Hour
	old, young := now.Add(-retention-time.Minute), now.Add(-retention+time.Minute)

	base := t.TempDir()
	root := filepath.Join(base, "pc")
	stateDir := filepath.Join(base, "state")
	models := filepath.Join(base, "models")
	f := NewProcessFactory(ProcessConfig{PromptCacheDir: root, PromptCacheSSDBytes: 1 << 30, StateDir: stateDir})
	spec := func(name string) enginepool.ModelSpec {
		return enginepool.ModelSpec{Name: name, Path: filepath.Join(models, name+".gguf"), PromptCache: enginepool.PromptCacheSpec{Enabled: true}}
	}
	id := func(name string) string { return PromptCacheDirName("", spec(name).Path) }

	// A runner of "claimed" runs: its directory is held, however old its files.
	claimed := f.claimCacheDir(spec("claimed"))
	cacheFiles(t, claimed, 100, old)
	// An earlier agent's runner of "recorded" awaits adoption.
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	recorded := filepath.Join(root, id("recorded")+"~2")
	if err := writeRecord(stateDir, &runnerRecord{ID: "r0123", Model: "recorded", PID: os.Getpid(), Nonce: "n", CacheDir: recorded}); err != nil {
		t.Fatal(err)
	}
	cacheFiles(t, recorded, 100, old)
	// "kept" is still registered, not loaded.
	cacheFiles(t, filepath.Join(root, id("kept")), 100, old)
	// Gone models: one idle long enough, in two directories, one used lately.
	cacheFiles(t, filepath.Join(root, id("gone")), 1000, old)
	cacheFiles(t, filepath.Join(root, id("gone")+"~3"), 500, old)
	cacheFiles(t, filepath.Join(root, "sha256-"+string(slices.Repeat([]byte("ab"), 32))), 300, old)
	cacheFiles(t, filepath.Join(root, id("young")), 100, old)
	if err := os.WriteFile(filepath.Join(root, id("young"), "fmt-1", "fresh.state"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(filepath.Join(root, id("young"), "fmt-1", "fresh.state"), young, young); err != nil {
		t.Fatal(err)
	}

	// Outside the prompt cache directory: a young file that an old directory links
	// to (neither its age nor its removal may go through the link), and a directory
	// that a link named like a cache directory points to.
	outside := filepath.Join(base, "outside")
	cacheFiles(t, outside, 4096, young)
	linker := filepath.Join(root, id("linker"))
	cacheFiles(t, linker, 10, old)
	if err := os.Symlink(outside, filepath.Join(linker, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(root, id("symlinked"))); err != nil {
		t.Fatal(err)
	}
	// A directory that is not a cache directory, however old.
	cacheFiles(t, filepath.Join(root, "notes"), 10, old)
	// The symlink's own times are those of its creation (now): age it.
	lchtimes(t, filepath.Join(linker, "escape"), old)
	if err := os.Chtimes(linker, old, old); err != nil {
		t.Fatal(err)
	}

	rep, err := f.PrunePromptCacheDirs(t.Context(), PromptCachePruneOptions{Now: now, Retention: retention,
		KeepModels: []string{spec("kept").Path}})
	if err != nil {
		t.Fatal(err)
	}
	wantRemoved := []string{filepath.Join(root, id("gone")), filepath.Join(root, id("gone")+"~3"), linker,
		filepath.Join(root, "sha256-"+string(slices.Repeat([]byte("ab"), 32)))}
	slices.Sort(wantRemoved)
	got := slices.Clone(rep.Removed)
	slices.Sort(got)
	if diff := cmp.Diff(wantRemoved, got); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}
	if want := int64(1000 + 500 + 300 + 10); rep.FreedBytes != want {
		t.Errorf("FreedBytes = %d, want %d (the links' targets not counted)", rep.FreedBytes, want)
	}
	wantLeft := []string{filepath.Base(claimed), id("kept"), filepath.Base(recorded), id("symlinked"), id("young"), "notes"}
	slices.Sort(wantLeft)
	if diff := cmp.Diff(wantLeft, lsDir(t, root)); diff != "" {
		t.Errorf("left in the prompt cache directory (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"fmt-1"}, lsDir(t, outside)); diff != "" {
		t.Errorf("the directory outside (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(outside, "fmt-1", "0123abcd.state")); err != nil {
		t.Errorf("the file outside the prompt cache directory: %v", err)
	}

	// A runner starting while its directory is being pruned gets another one; a
	// released directory is a candidate again.
	if !f.holdCacheDirForPrune(filepath.Join(root, id("gone"))) {
		t.Fatal("holding an unclaimed directory failed")
	}
	if d := f.claimCacheDir(spec("gone")); d != filepath.Join(root, id("gone")+"~2") {
		t.Errorf("a runner starting during the prune got %s, want the next index", d)
	}
	f.releaseCacheDir(claimed)
	rep, err = f.PrunePromptCacheDirs(t.Context(), PromptCachePruneOptions{Now: now, Retention: retention})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{claimed, filepath.Join(root, id("kept"))}, rep.Removed); diff != "" {
		t.Errorf("removed once released and no longer kept (-want +got):\n%s", diff)
	}
}

func TestCacheDirID(t *testing.T) {
	dir := t.TempDir()
	pathID := PromptCacheModelID(filepath.Join(dir, "Qwen 2.5 7B.Q4_K_M.gguf"))
	digest := "sha256-" + string(slices.Repeat([]byte("0f"), 32))
	for _, tc := range []struct {
		name, id   string
		legacy, ok bool
	}{
		{"team-a_" + pathID, pathID, false, true},
		{"team-a_" + pathID + "~2", pathID, false, true},
		{"local_" + digest, digest, false, true},
		{"t1_" + digest + "~3", digest, false, true},
		{PromptCacheDirName("", digest), digest, false, true},
		{PromptCacheDirName("team-b", filepath.Join(dir, "m.gguf")), PromptCacheModelID(filepath.Join(dir, "m.gguf")), false, true},
		// Before namespaces: recognized, to be pruned, never kept.
		{pathID, pathID, true, true},
		{pathID + "~17", pathID, true, true},
		{digest, digest, true, true},
		{digest + "~3", digest, true, true},
		{"Team_" + digest, "", true, false},
		{"-a_" + digest, "", true, false},
		{"team-a_" + pathID + "~1", "", true, false},
		{pathID + "~1", "", true, false},
		{pathID + "~02", "", true, false},
		{pathID + "~x", "", true, false},
		{"notes", "", true, false},
		{"sha256-ABC", "", true, false},
		{".hidden-0123456789ab", "", true, false},
		{"a b-0123456789ab", "", true, false},
	} {
		id, legacy, ok := cacheDirID(tc.name)
		if id != tc.id || ok != tc.ok || (ok && legacy != tc.legacy) {
			t.Errorf("cacheDirID(%q) = %q, legacy %v, %v; want %q, legacy %v, %v", tc.name, id, legacy, ok, tc.id, tc.legacy, tc.ok)
		}
	}
}
