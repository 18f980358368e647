package promptcache

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fakeDisk is an injected statfs: a fixed free figure, and a count of readings.
type fakeDisk struct {
	mu    sync.Mutex
	free  int64
	calls int
}

func (d *fakeDisk) Statfs(string) (int64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	return d.free, nil
}

func (d *fakeDisk) set(free int64) {
	d.mu.Lock()
	d.free = free
	d.mu.Unlock()
}

func (d *fakeDisk) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls
}

var testID = Identity{Model: "sha256:abc/tiny-model", Format: "llama-seq-v1 kv=f16 ctx=4096"}

// openSSD opens an SSD tier in a fresh directory (unless cfg.Dir is set) with a fake
// disk of 1 TiB free and a fake clock unless the config brings its own.
func openSSD(t *testing.T, cfg SSDConfig) *SSD {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Identity == (Identity{}) {
		cfg.Identity = testID
	}
	if cfg.Statfs == nil {
		d := &fakeDisk{free: 1 << 40}
		cfg.Statfs = d.Statfs
	}
	if cfg.Clock == nil {
		cfg.Clock = newFakeClock()
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// key returns a distinct key per i.
func key(i int) Key {
	return BlockKeys(testID, "", []int32{int32(i)}, 1)[0]
}

// payload returns n bytes derived from i, so a wrong state is detectable.
func payload(i, n int) []byte {
	b := bytes.Repeat([]byte{byte(i), byte(i >> 8), 0x5a}, n/3+1)
	return b[:n]
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// settled reports whether every accepted save has an outcome and nothing is queued.
func settled(st SSDStats) bool {
	return st.Queued == 0 &&
		st.Saves == st.SavesPersisted+st.Duplicates+st.QuotaRejects+st.Cancelled+st.Errors
}

func waitSettled(t *testing.T, s *SSD) SSDStats {
	t.Helper()
	var st SSDStats
	eventually(t, 10*time.Second, "the SSD tier to settle", func() bool {
		st = s.Stats()
		return settled(st)
	})
	return st
}

// diskUsage sums the regular files under dir.
func diskUsage(t *testing.T, dir string) (bytes int64, files int) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			bytes += info.Size()
			files++
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", dir, err)
	}
	return bytes, files
}

// filesOf lists the files of key k (entries and temporaries) in the tier's directory.
func filesOf(t *testing.T, s *SSD, k Key) []string {
	t.Helper()
	des, err := os.ReadDir(s.Dir())
	if err != nil {
		t.Fatalf("reading %s: %v", s.Dir(), err)
	}
	var out []string
	for _, de := range des {
		if strings.HasPrefix(de.Name(), k.String()) {
			out = append(out, de.Name())
		}
	}
	return out
}

func writeForeign(t *testing.T, path string, size int, mtime time.Time) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
}

// gate blocks writes until released; entered counts writes that reached it.
type gate struct {
	mu      sync.Mutex
	release chan struct{}
	entered int
	block   func(n int) bool // which write (1-based) blocks; nil = all
}

func newGate(block func(n int) bool) *gate {
	return &gate{release: make(chan struct{}), block: block}
}

func (g *gate) writeFile(path string, header, payload []byte, sync bool) error {
	g.mu.Lock()
	g.entered++
	n := g.entered
	g.mu.Unlock()
	if g.block == nil || g.block(n) {
		<-g.release
	}
	return writeEntryFile(path, header, payload, sync)
}

func (g *gate) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.entered
}

func (g *gate) open() { close(g.release) }
