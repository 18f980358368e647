package store

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// hubParts is a hub serving a model stored in three parts at
// /hub/org/repo/resolve/main/Q4/m-0000i-of-00003.gguf.
type hubParts struct {
	*origin
	mu    sync.Mutex
	parts map[string][]byte
	// cutOnce, when set, is a part whose first answer is cut after half its bytes.
	cutOnce string
}

const partsSource = "hf://org/repo/Q4/m-00001-of-00003.gguf"

func partName(no int) string { return "m-0000" + strconv.Itoa(no) + "-of-00003.gguf" }

func newHubParts(t *testing.T) *hubParts {
	h := &hubParts{parts: map[string][]byte{}}
	for i := 1; i <= 3; i++ {
		h.parts[partName(i)] = model(48<<10+i*1000, uint64(20+i))
	}
	h.origin = newOrigin(t, nil)
	h.origin.handle = func(w http.ResponseWriter, r *http.Request, _ int) {
		name, ok := strings.CutPrefix(r.URL.Path, "/hub/org/repo/resolve/main/Q4/")
		h.mu.Lock()
		b, found := h.parts[name]
		cut := h.cutOnce == name
		if cut {
			h.cutOnce = ""
		}
		h.mu.Unlock()
		if !ok || !found {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("ETag", `"`+name+`"`)
		if cut {
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(b[:len(b)/2])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		http.ServeContent(w, r, "", modTime, bytes.NewReader(b))
	}
	return h
}

func (h *hubParts) total() int64 {
	var n int64
	for _, b := range h.parts {
		n += int64(len(b))
	}
	return n
}

// checkBeside fails the test unless every part is under its own name beside the
// first part's path, with its content.
func (h *hubParts) checkBeside(t *testing.T, first string) {
	t.Helper()
	if filepath.Base(first) != partName(1) {
		t.Fatalf("the model's path %s is not named as its first part", first)
	}
	for i := 1; i <= 3; i++ {
		if got := readFile(t, filepath.Join(filepath.Dir(first), partName(i))); !bytes.Equal(got, h.parts[partName(i)]) {
			t.Errorf("part %d beside the first: %d bytes, not the hub's", i, len(got))
		}
	}
}

func TestFetchDownloadsEveryPart(t *testing.T) {
	h := newHubParts(t)
	dir := t.TempDir()
	s := newStore(t, dir, h.origin)
	prog := &progressLog{t: t}
	p, err := s.Fetch(t.Context(), testNS, partsSource, "", prog.fn)
	if err != nil {
		t.Fatal(err)
	}
	h.checkBeside(t, p)
	if got, want := prog.last(), [2]int64{h.total(), h.total()}; got != want {
		t.Errorf("last progress %v, want %v (every part's bytes)", got, want)
	}
	gets := len(h.requests())
	if gets != 3 {
		t.Errorf("%d requests for three parts: %+v", gets, h.requests())
	}

	// Found again without network, by this store and by a new one on the directory.
	for _, st := range []*Store{s, newStore(t, dir, h.origin)} {
		again, err := st.Fetch(t.Context(), testNS, partsSource, "", nil)
		if err != nil || again != p {
			t.Fatalf("Fetch again: %q %v, want %q", again, err, p)
		}
	}
	if n := len(h.requests()); n != gets {
		t.Errorf("fetching the stored parts again made %d requests", n-gets)
	}
}

func TestFetchPartsResumesAPartCutShort(t *testing.T) {
	h := newHubParts(t)
	h.cutOnce = partName(2)
	s := newStore(t, t.TempDir(), h.origin)
	if _, err := s.Fetch(t.Context(), testNS, partsSource, "", nil); err == nil || !strings.Contains(err.Error(), "part 2 of the 3 files of "+partsSource) {
		t.Fatalf("Fetch with part 2 cut short: %v, want an error naming part 2", err)
	}
	before := len(h.requests())
	p, err := s.Fetch(t.Context(), testNS, partsSource, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	h.checkBeside(t, p)
	var paths, ranges []string
	for _, r := range h.requests()[before:] {
		paths = append(paths, filepath.Base(r.Path))
		ranges = append(ranges, r.Range)
	}
	half := len(h.parts[partName(2)]) / 2
	if len(paths) != 2 || paths[0] != partName(2) || ranges[0] != "bytes="+strconv.Itoa(half)+"-" || paths[1] != partName(3) {
		t.Errorf("after the cut: requests for %v with ranges %q; want part 2 resumed at %d, then part 3", paths, ranges, half)
	}
}

func TestFetchPartsMissingPart(t *testing.T) {
	h := newHubParts(t)
	delete(h.parts, partName(3))
	s := newStore(t, t.TempDir(), h.origin)
	_, err := s.Fetch(t.Context(), testNS, partsSource, "", nil)
	if err == nil || !strings.Contains(err.Error(), "part 3 of the 3 files of "+partsSource) || !strings.Contains(err.Error(), "404") {
		t.Fatalf("Fetch with part 3 missing: %v, want an error naming part 3 and the hub's 404", err)
	}
	if Retryable(err) {
		t.Errorf("a missing part is retryable: %v", err)
	}
}

func TestFetchPartsRefusesASHA256(t *testing.T) {
	s := newStore(t, t.TempDir(), newHubParts(t).origin)
	_, err := s.Fetch(t.Context(), testNS, partsSource, strings.Repeat("a", 64), nil)
	var de *DigestError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "stored in parts") {
		t.Fatalf("Fetch of parts with a sha256: %v, want a *DigestError", err)
	}
}

func TestFetchLocalParts(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	for i := 1; i <= 3; i++ {
		p := filepath.Join(dir, partName(i))
		if err := os.WriteFile(p, model(4096, uint64(i)), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	s := newStore(t, t.TempDir(), nil)
	got, err := s.Fetch(t.Context(), testNS, "file://"+paths[0], "", nil)
	if err != nil || got != paths[0] {
		t.Fatalf("Fetch of local parts: %q %v, want the first part %s in place", got, err, paths[0])
	}
	if err := os.Remove(paths[1]); err != nil {
		t.Fatal(err)
	}
	_, err = s.Fetch(t.Context(), testNS, "file://"+paths[0], "", nil)
	var le *LocalFileError
	if !errors.As(err, &le) || !strings.Contains(err.Error(), "part 2 of the 3 files") || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("Fetch with a local part missing: %v, want a *LocalFileError naming part 2", err)
	}
}

func TestPruneKeepsThePartsOfAModelInUse(t *testing.T) {
	h := newHubParts(t)
	dir := t.TempDir()
	clk := clocktesting.NewFakeClock(time.Now())
	s := newStore(t, dir, h.origin, withClock(clk))
	p, err := s.Fetch(t.Context(), testNS, partsSource, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	clk.Step(2 * retention)
	for _, opts := range []PruneOptions{
		{KeepPaths: []string{p}, Retention: retention},
		{Keep: []Model{{Source: partsSource}}, Retention: retention},
	} {
		rep, err := s.Prune(t.Context(), opts)
		if err != nil || len(rep.Removed) != 0 {
			t.Fatalf("Prune keeping the model (%+v): removed %+v, %v", opts, rep.Removed, err)
		}
		h.checkBeside(t, p)
		clk.Step(2 * retention)
	}
	rep, err := s.Prune(t.Context(), PruneOptions{Retention: retention})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, r := range rep.Removed {
		kinds[r.Kind]++
	}
	if kinds[KindBlob] != 3 || kinds[KindParts] != 1 {
		t.Errorf("Prune of an unused model in parts removed %v, want its 3 blobs and its parts directory", kinds)
	}
	again, err := s.Fetch(t.Context(), testNS, partsSource, "", nil)
	if err != nil || again != p {
		t.Fatalf("Fetch after the prune: %q %v", again, err)
	}
	h.checkBeside(t, again)
}
