package estimate

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/internal/modelsource"
)

// partsModel writes spec in one file and in three parts into a new directory and
// returns the one file's path and the parts'.
func partsModel(t *testing.T, spec ggufsynth.Spec) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	one := filepath.Join(dir, "one.gguf")
	if err := ggufsynth.Write(one, spec); err != nil {
		t.Fatal(err)
	}
	parts, err := ggufsynth.WriteParts(filepath.Join(dir, "m"), spec, 3)
	if err != nil {
		t.Fatal(err)
	}
	return one, parts
}

// sameModel fails the test unless the estimate of the parts is the one file's: the
// same weights, cache, compute and dimensions; the headers of three files take a few
// KiB more than one's.
func sameModel(t *testing.T, one, parts Result, oneSize, partsSize int64) {
	t.Helper()
	if diff := cmp.Diff(one, parts, cmpopts.IgnoreFields(Result{}, "Total", "Overhead", "FileSize")); diff != "" {
		t.Errorf("the estimate of three parts differs from the one file's (-one +parts):\n%s", diff)
	}
	if parts.FileSize != partsSize || one.FileSize != oneSize {
		t.Errorf("file sizes %d (parts) and %d (one), want %d and %d", parts.FileSize, one.FileSize, partsSize, oneSize)
	}
	if d := parts.Total - one.Total; d < 0 || d > 64<<10 {
		t.Errorf("the parts' total is %d bytes above the one file's, want 0 to 64 KiB (two more headers)", d)
	}
}

func fileSizes(t *testing.T, paths ...string) int64 {
	t.Helper()
	var n int64
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

func TestEstimateCountsEveryLocalPart(t *testing.T) {
	spec := ggufsynth.Tiny()
	one, parts := partsModel(t, spec)
	p := Params{ContextLength: 1024, Parallel: 2}
	p.Path = one
	whole, err := Estimate(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	p.Path = parts[0]
	split, err := Estimate(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	sameModel(t, whole, split, fileSizes(t, one), fileSizes(t, parts...))

	if err := os.Remove(parts[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := Estimate(t.Context(), p); err == nil || !strings.Contains(err.Error(), filepath.Base(parts[2])) {
		t.Errorf("estimate with the third part missing: %v, want an error naming it", err)
	}
}

// partsHub serves the files of dir under /org/repo/resolve/main/, to the holder of
// token when one is set, and counts the requests without a range.
type partsHub struct {
	*httptest.Server
	mu      sync.Mutex
	whole   int
	paths   map[string]int
	missing string
}

func newPartsHub(t *testing.T, dir, token string) *partsHub {
	t.Helper()
	h := &partsHub{paths: map[string]int{}}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, ok := strings.CutPrefix(r.URL.Path, "/org/repo/resolve/main/")
		h.mu.Lock()
		h.paths[name]++
		if r.Header.Get("Range") == "" {
			h.whole++
		}
		missing := h.missing
		h.mu.Unlock()
		switch {
		case token != "" && r.Header.Get("Authorization") != "Bearer "+token:
			http.Error(w, "gated", http.StatusUnauthorized)
		case !ok || strings.Contains(name, "/") || name == missing:
			http.NotFound(w, r)
		default:
			http.ServeFile(w, r, filepath.Join(dir, name))
		}
	}))
	t.Cleanup(h.Close)
	return h
}

func TestEstimateReadsEveryRemotePartsHeader(t *testing.T) {
	spec := ggufsynth.Tiny()
	one, parts := partsModel(t, spec)
	hub := newPartsHub(t, filepath.Dir(one), "hf_gated")
	loc, err := (&modelsource.Resolver{HFEndpoint: hub.URL}).ResolveString(t.Context(), "hf://org/repo/m-00001-of-00003.gguf")
	if err != nil {
		t.Fatal(err)
	}
	p := Params{ContextLength: 1024, Parallel: 2, Header: http.Header{"Authorization": {"Bearer hf_gated"}}}
	p.Path = one
	whole, err := Estimate(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	p.Path, p.URL = "", loc.URL
	split, err := Estimate(t.Context(), p)
	if err != nil {
		t.Fatal(err)
	}
	sameModel(t, whole, split, fileSizes(t, one), fileSizes(t, parts...))
	hub.mu.Lock()
	seen, wholeGets := hub.paths, hub.whole
	hub.mu.Unlock()
	for _, part := range parts {
		if seen[filepath.Base(part)] == 0 {
			t.Errorf("the hub was not asked for %s: %v", filepath.Base(part), seen)
		}
	}
	if wholeGets != 0 {
		t.Errorf("%d requests without a range: the parts' headers are read by range", wholeGets)
	}

	hub.mu.Lock()
	hub.missing = filepath.Base(parts[1])
	hub.mu.Unlock()
	_, err = Estimate(t.Context(), p)
	var status *modelsource.StatusError
	if !errors.As(err, &status) || !status.NotFound() || !strings.Contains(err.Error(), hub.missing) {
		t.Errorf("estimate with the second part missing: %v, want the hub's 404 for it", err)
	}
}
