package store

import (
	"bytes"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	clocktesting "k8s.io/utils/clock/testing"
)

const retention = 24 * time.Hour

// fleet is an origin serving three models at /a.gguf, /b.gguf and /c.gguf.
type fleet struct {
	*origin
	content map[string][]byte
}

func newFleet(t *testing.T) *fleet {
	f := &fleet{content: map[string][]byte{"a": model(64<<10, 11), "b": model(96<<10, 12), "c": model(128<<10, 13)}}
	f.origin = newOrigin(t, nil)
	f.origin.handle = func(w http.ResponseWriter, r *http.Request, _ int) {
		b, ok := f.content[strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/"), ".gguf")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("ETag", `"v1"`)
		http.ServeContent(w, r, "", modTime, bytes.NewReader(b))
	}
	return f
}

func (f *fleet) url(name string) string { return f.URL + "/" + name + ".gguf" }

// model b is fetched without a sha256: the store finds it through its ref.
func (f *fleet) sha(name string) string {
	if name == "b" {
		return ""
	}
	return sum(f.content[name])
}

func (f *fleet) blob(name string) string { return "blobs/sha256-" + sum(f.content[name]) }

func (f *fleet) gets() int {
	n := 0
	for _, r := range f.requests() {
		if r.Status == http.StatusOK {
			n++
		}
	}
	return n
}

func withClock(c *clocktesting.FakeClock) func(*Options) {
	return func(o *Options) { o.Clock = c }
}

func fetchAll(t *testing.T, s *Store, f *fleet, names ...string) map[string]string {
	t.Helper()
	paths := map[string]string{}
	for _, n := range names {
		p, err := s.Fetch(t.Context(), testNS, f.url(n), f.sha(n), nil)
		if err != nil {
			t.Fatalf("Fetch %s: %v", n, err)
		}
		paths[n] = p
	}
	return paths
}

func kinds(rep PruneReport) []string {
	var out []string
	for _, r := range rep.Removed {
		out = append(out, r.Kind+" "+filepath.Base(r.Path))
	}
	slices.Sort(out)
	return out
}

func TestPruneBlobs(t *testing.T) {
	tests := []struct {
		name string
		// age is how long after the fetches Prune runs.
		age       time.Duration
		keep      func(f *fleet, paths map[string]string) PruneOptions
		wantKept  []string // of a, b, c
		wantFreed func(f *fleet) int64
	}{{
		name:     "unused but young files are kept",
		age:      retention - time.Minute,
		keep:     func(*fleet, map[string]string) PruneOptions { return PruneOptions{} },
		wantKept: []string{"a", "b", "c"},
	}, {
		name:     "unused old files are removed",
		age:      retention + time.Minute,
		keep:     func(*fleet, map[string]string) PruneOptions { return PruneOptions{} },
		wantKept: nil,
		wantFreed: func(f *fleet) int64 {
			return int64(len(f.content["a"]) + len(f.content["b"]) + len(f.content["c"]))
		},
	}, {
		name: "files in use by source are kept whatever their age",
		age:  10 * retention,
		keep: func(f *fleet, _ map[string]string) PruneOptions {
			return PruneOptions{Keep: []Model{{Source: f.url("a"), SHA256: f.sha("a")}, {Source: f.url("b")}}}
		},
		wantKept:  []string{"a", "b"},
		wantFreed: func(f *fleet) int64 { return int64(len(f.content["c"])) },
	}, {
		name: "files in use by path are kept whatever their age",
		age:  10 * retention,
		keep: func(_ *fleet, paths map[string]string) PruneOptions {
			return PruneOptions{KeepPaths: []string{paths["c"]}}
		},
		wantKept:  []string{"c"},
		wantFreed: func(f *fleet) int64 { return int64(len(f.content["a"]) + len(f.content["b"])) },
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet(t)
			clk := clocktesting.NewFakeClock(time.Now())
			dir := t.TempDir()
			s := newStore(t, dir, f.origin, withClock(clk))
			paths := fetchAll(t, s, f, "a", "b", "c")
			clk.Step(tt.age)
			opts := tt.keep(f, paths)
			opts.Retention = retention
			rep, err := s.Prune(t.Context(), opts)
			if err != nil {
				t.Fatalf("Prune: %v", err)
			}
			var want []string
			for _, n := range tt.wantKept {
				want = append(want, f.blob(n), "used/sha256-"+sum(f.content[n]), "refs/"+hashName(f.url(n))+".json")
			}
			slices.Sort(want)
			if diff := cmp.Diff(want, files(t, dir)); diff != "" {
				t.Errorf("store files after Prune (-want +got):\n%s", diff)
			}
			var wantFreed int64
			if tt.wantFreed != nil {
				wantFreed = tt.wantFreed(f)
			}
			var blobBytes, all int64
			for _, r := range rep.Removed {
				all += r.Bytes
				if r.Kind == KindBlob {
					blobBytes += r.Bytes
				}
			}
			if blobBytes != wantFreed || rep.FreedBytes != all {
				t.Errorf("freed %d bytes of model files, %d in all (report: %d), want %d of model files (removed %v)",
					blobBytes, all, rep.FreedBytes, wantFreed, kinds(rep))
			}
			// What was kept because it is in use has a fresh use time: another agent
			// sharing the directory, without it in use, keeps it for another retention.
			if len(opts.Keep)+len(opts.KeepPaths) > 0 {
				other := newStore(t, dir, nil, withClock(clk))
				clk.Step(retention - time.Minute)
				if rep, err := other.Prune(t.Context(), PruneOptions{Retention: retention}); err != nil || len(rep.Removed) != 0 {
					t.Errorf("another agent's Prune removed %v (err %v), want nothing: the files were in use %v ago",
						kinds(rep), err, retention-time.Minute)
				}
			}
		})
	}
}

// A Fetch that finds the file already there counts as a use, in any agent sharing the
// directory.
func TestFetchOfAStoredFileIsAUse(t *testing.T) {
	f := newFleet(t)
	clk := clocktesting.NewFakeClock(time.Now())
	dir := t.TempDir()
	a := newStore(t, dir, f.origin, withClock(clk))
	b := newStore(t, dir, f.origin, withClock(clk))
	fetchAll(t, a, f, "a", "b")
	clk.Step(retention - time.Hour)
	fetchAll(t, b, f, "a") // found without network
	if n := f.gets(); n != 2 {
		t.Fatalf("%d downloads, want 2", n)
	}
	clk.Step(2 * time.Hour)
	rep, err := a.Prune(t.Context(), PruneOptions{Retention: retention})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"blob sha256-" + sum(f.content["b"]), "ref " + hashName(f.url("b")) + ".json"}
	if diff := cmp.Diff(want, kinds(rep)); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}
}

func TestFetchAfterPruneDownloadsAgain(t *testing.T) {
	f := newFleet(t)
	clk := clocktesting.NewFakeClock(time.Now())
	s := newStore(t, t.TempDir(), f.origin, withClock(clk))
	for _, name := range []string{"a", "b"} { // with and without sha256
		fetchAll(t, s, f, name)
		clk.Step(retention + time.Minute)
		if _, err := s.Prune(t.Context(), PruneOptions{Retention: retention}); err != nil {
			t.Fatal(err)
		}
		before := f.gets()
		p := fetchAll(t, s, f, name)[name]
		if got := f.gets() - before; got != 1 {
			t.Errorf("%s: %d downloads after the prune, want 1", name, got)
		}
		if !bytes.Equal(readFile(t, p), f.content[name]) {
			t.Errorf("%s: the file fetched again differs from the served one", name)
		}
	}
}

// agePartial leaves a partial download of f's model name, written d ago.
func agePartial(t *testing.T, dir string, f *fleet, clk *clocktesting.FakeClock, name string, d time.Duration) string {
	t.Helper()
	p := partialPath(t, dir, f.url(name))
	if err := os.WriteFile(p, f.content[name][:1000], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p+".json", mustJSON(t, partialMeta{URL: f.url(name), ETag: `"v1"`, Total: int64(len(f.content[name]))}), 0o644); err != nil {
		t.Fatal(err)
	}
	old := clk.Now().Add(-d)
	for _, q := range []string{p, p + ".json"} {
		if err := os.Chtimes(q, old, old); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func TestPrunePartials(t *testing.T) {
	f := newFleet(t)
	clk := clocktesting.NewFakeClock(time.Now())
	dir := t.TempDir()
	s := newStore(t, dir, f.origin, withClock(clk))

	stale := agePartial(t, dir, f, clk, "a", retention+time.Minute)
	young := agePartial(t, dir, f, clk, "b", retention-time.Minute)
	kept := agePartial(t, dir, f, clk, "c", 10*retention)
	// Another agent sharing the directory downloads a: it holds the lock.
	lf, err := os.OpenFile(stale, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	keepC := PruneOptions{Retention: retention, Keep: []Model{{Source: f.url("c"), SHA256: f.sha("c")}}}
	rep, err := s.Prune(t.Context(), keepC)
	if err != nil || len(rep.Removed) != 0 {
		t.Fatalf("Prune with the stale partial locked removed %v (err %v), want nothing", kinds(rep), err)
	}
	lf.Close()

	rep, err = s.Prune(t.Context(), keepC)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"partial " + filepath.Base(stale)}, kinds(rep)); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}
	metaSize := int64(len(mustJSON(t, partialMeta{URL: f.url("a"), ETag: `"v1"`, Total: int64(len(f.content["a"]))})))
	if want := 1000 + metaSize; rep.FreedBytes != want {
		t.Errorf("FreedBytes = %d, want %d (the partial and its metadata)", rep.FreedBytes, want)
	}
	for _, p := range []string{young, young + ".json", kept, kept + ".json"} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v, want it kept", filepath.Base(p), err)
		}
	}
	if _, err := os.Stat(stale + ".json"); !os.IsNotExist(err) {
		t.Errorf("the stale partial's metadata: %v, want it removed", err)
	}
}

// A download in progress holds its partial file's lock: Prune leaves it alone however
// long the server has been silent, and the download completes.
func TestPruneLeavesADownloadInProgress(t *testing.T) {
	f := newFleet(t)
	release := make(chan struct{})
	serve := f.origin.handle
	f.origin.handle = func(w http.ResponseWriter, r *http.Request, n int) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		serve(w, r, n)
	}
	clk := clocktesting.NewFakeClock(time.Now())
	dir := t.TempDir()
	s := newStore(t, dir, f.origin, withClock(clk))
	done := make(chan error, 1)
	go func() { _, err := s.Fetch(t.Context(), testNS, f.url("a"), f.sha("a"), nil); done <- err }()
	eventually(t, "the download's request", func() bool { return len(f.requests()) == 1 })
	partial := partialPath(t, dir, f.url("a"))
	clk.Step(10 * retention)
	rep, err := s.Prune(t.Context(), PruneOptions{Retention: retention})
	if err != nil || len(rep.Removed) != 0 {
		t.Fatalf("Prune during the download removed %v (err %v), want nothing", kinds(rep), err)
	}
	if _, err := os.Stat(partial); err != nil {
		t.Fatalf("the partial file: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the download: %v", err)
	}
}

func TestPruneRecordsThatPointToNothing(t *testing.T) {
	f := newFleet(t)
	clk := clocktesting.NewFakeClock(time.Now())
	dir := t.TempDir()
	s := newStore(t, dir, f.origin, withClock(clk))
	fetchAll(t, s, f, "b") // refs/<b>.json -> its blob, kept
	// A ref whose file is gone (another agent removed it, or a user did).
	goneRef := filepath.Join(dir, "refs", hashName("https://example.com/gone.gguf")+".json")
	if err := os.WriteFile(goneRef, mustJSON(t, ref{Source: "https://example.com/gone.gguf", Digest: sum([]byte("gone"))}), 0o644); err != nil {
		t.Fatal(err)
	}
	// Local files verified in place: one still there, one deleted since.
	local := t.TempDir()
	for _, n := range []string{"here", "deleted"} {
		p := filepath.Join(local, n+".gguf")
		if err := os.WriteFile(p, f.content["a"], 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Fetch(t.Context(), testNS, "file://"+p, f.sha("a"), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(local, "deleted.gguf")); err != nil {
		t.Fatal(err)
	}
	// The use marker of a file that is gone.
	orphan := filepath.Join(dir, "used", "sha256-"+sum([]byte("orphan")))
	if err := os.WriteFile(orphan, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// A record that cannot be read is removed only once old.
	junk := filepath.Join(dir, "refs", "junk.json")
	if err := os.WriteFile(junk, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}

	rep, err := s.Prune(t.Context(), PruneOptions{Retention: retention, Keep: []Model{{Source: f.url("b")}}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"local " + hashName(filepath.Join(local, "deleted.gguf")) + ".json",
		"marker " + filepath.Base(orphan), "ref " + filepath.Base(goneRef)}
	if diff := cmp.Diff(want, kinds(rep)); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}
	clk.Step(retention + time.Minute)
	rep, err = s.Prune(t.Context(), PruneOptions{Retention: retention, Keep: []Model{{Source: f.url("b")}}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"ref junk.json"}, kinds(rep)); diff != "" {
		t.Errorf("removed once old (-want +got):\n%s", diff)
	}
	wantFiles := []string{f.blob("b"), "local/" + hashName(filepath.Join(local, "here.gguf")) + ".json",
		"refs/" + hashName(f.url("b")) + ".json", "used/sha256-" + sum(f.content["b"])}
	if diff := cmp.Diff(wantFiles, files(t, dir)); diff != "" {
		t.Errorf("store files (-want +got):\n%s", diff)
	}
	if _, err := s.Prune(t.Context(), PruneOptions{}); err == nil {
		t.Errorf("Prune without a retention succeeded, want an error")
	}
}

// Two agents share a directory; each fetches and prunes at the same time, with every
// file older than the retention when a round starts and nothing in use. Every path a
// Fetch returns must hold its file until the round ends: the Fetch's use makes the
// file young, so a Prune either saw that use or removed the file before the Fetch
// looked, and then the Fetch downloaded it again.
func TestConcurrentFetchAndPrune(t *testing.T) {
	f := newFleet(t)
	clk := clocktesting.NewFakeClock(time.Now())
	dir := t.TempDir()
	stores := []*Store{newStore(t, dir, f.origin, withClock(clk)), newStore(t, dir, f.origin, withClock(clk))}
	names := []string{"a", "b", "c"}
	var removedBlobs atomic.Int64
	const rounds = 50
	for round := range rounds {
		// Age everything there is.
		old := clk.Now().Add(-2 * retention)
		for _, sub := range []string{"blobs", "used"} {
			entries, _ := os.ReadDir(filepath.Join(dir, sub))
			for _, e := range entries {
				if err := os.Chtimes(filepath.Join(dir, sub, e.Name()), old, old); err != nil {
					t.Fatal(err)
				}
			}
		}
		type got struct{ name, path string }
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			fetched []got
		)
		for i := range 4 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(round), uint64(i)))
				for range 5 {
					n := names[rng.IntN(len(names))]
					p, err := stores[i%2].Fetch(t.Context(), testNS, f.url(n), f.sha(n), nil)
					if err != nil {
						t.Errorf("round %d: Fetch %s: %v", round, n, err)
						return
					}
					if _, err := os.Stat(p); err != nil {
						t.Errorf("round %d: the path Fetch just returned for %s: %v", round, n, err)
					}
					mu.Lock()
					fetched = append(fetched, got{n, p})
					mu.Unlock()
				}
			})
		}
		for i := range 2 {
			wg.Go(func() {
				for range 3 {
					rep, err := stores[i].Prune(t.Context(), PruneOptions{Retention: retention})
					if err != nil {
						t.Errorf("round %d: Prune: %v", round, err)
						return
					}
					for _, r := range rep.Removed {
						if r.Kind == KindBlob {
							removedBlobs.Add(1)
						}
					}
				}
			})
		}
		wg.Wait()
		for _, g := range fetched {
			b, err := os.ReadFile(g.path)
			if err != nil {
				t.Fatalf("round %d: the path Fetch returned for %s: %v", round, g.name, err)
			}
			if !bytes.Equal(b, f.content[g.name]) {
				t.Fatalf("round %d: %s holds other content than %s", round, g.path, g.name)
			}
		}
	}
	if removedBlobs.Load() == 0 {
		t.Fatalf("no Prune removed a file in %d rounds: the test exercised nothing", rounds)
	}
	t.Logf("%d files removed, %d downloads over %d rounds", removedBlobs.Load(), f.gets(), rounds)
}

func TestMarkUsedOfARemovedFile(t *testing.T) {
	s := newStore(t, t.TempDir(), nil)
	p := filepath.Join(s.Dir(), "blobs", "sha256-"+sum([]byte("x")))
	if err := s.markUsed(p); err != errPruned {
		t.Fatalf("markUsed of a missing file = %v, want errPruned", err)
	}
}
