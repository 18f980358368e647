package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A store with a Capacity counts every file under its directory against it: a
// download that does not fit fails as on a full disk, with nothing stored, and
// succeeds once the space is freed.
func TestCapacityFullDiskThenFreed(t *testing.T) {
	content := model(300_000, 11)
	o := newOrigin(t, content)
	dir := t.TempDir()
	s := newStore(t, dir, o, func(opts *Options) { opts.Capacity = 1_000_000 })
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 800_000), 0o644); err != nil {
		t.Fatal(err)
	}
	src := o.URL + "/m.gguf"
	_, err := s.Fetch(t.Context(), testNS, src, "", nil)
	var de *DiskSpaceError
	if !errors.As(err, &de) {
		t.Fatalf("Fetch with the store full = %v, want a *DiskSpaceError", err)
	}
	if de.Need != uint64(len(content)) || de.Free > 200_000 {
		t.Errorf("DiskSpaceError %+v, want Need %d and Free at most 200000", *de, len(content))
	}
	if !Retryable(err) || !strings.Contains(err.Error(), "not enough disk space") {
		t.Errorf("error %q: want a retryable full-disk error", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	path, err := s.Fetch(t.Context(), testNS, src, sum(content), nil)
	if err != nil {
		t.Fatalf("Fetch once the space is freed: %v", err)
	}
	if got, err := os.ReadFile(path); err != nil || sum(got) != sum(content) {
		t.Errorf("stored file %s: %v", path, err)
	}
}
