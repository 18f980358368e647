package promptcache

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const entrySize = 1000 // payload bytes; a file is headerSize more

func TestSSDSaveLoadAndRestart(t *testing.T) {
	dir := t.TempDir()
	clock := newFakeClock()
	s, err := Open(SSDConfig{Dir: dir, Identity: testID, Clock: clock, Statfs: (&fakeDisk{free: 1 << 40}).Statfs})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		clock.Step(time.Second)
		if err := s.Save(key(i), payload(i, entrySize+i)); err != nil {
			t.Fatalf("Save %d: %v", i, err)
		}
	}
	st := waitSettled(t, s)
	if st.SavesPersisted != 5 || st.Entries != 5 || st.Bytes != 5*(headerSize+entrySize)+10 {
		t.Fatalf("after 5 saves: %+v", st)
	}
	// A repeated key is not written again.
	if err := s.Save(key(0), payload(0, entrySize)); err != nil {
		t.Fatal(err)
	}
	if st := waitSettled(t, s); st.Duplicates != 1 || st.SavesPersisted != 5 {
		t.Errorf("duplicate save: %+v", st)
	}
	if err := s.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(key(9), payload(9, 10)); !errors.Is(err, ErrClosed) {
		t.Errorf("Save after Close = %v, want ErrClosed", err)
	}

	// Another format in the same cache directory sees these files as foreign.
	other := openSSD(t, SSDConfig{Dir: dir, Identity: Identity{Model: testID.Model, Format: "v2"}})
	if st := other.Stats(); st.Entries != 0 || st.ForeignFiles != 5 {
		t.Errorf("other format: %+v, want 0 entries and 5 foreign files", st)
	}

	// Restart: the index comes back from the files, usable as before.
	s2 := openSSD(t, SSDConfig{Dir: dir, Clock: clock})
	if st := s2.Stats(); st.Entries != 5 || st.Bytes != 5*(headerSize+entrySize)+10 || st.ForeignFiles != 0 {
		t.Fatalf("after restart: %+v", st)
	}
	for i := range 5 {
		got, ok := s2.Load(key(i))
		if !ok || !bytes.Equal(got, payload(i, entrySize+i)) {
			t.Errorf("key %d after restart: ok=%v, %d bytes", i, ok, len(got))
		}
	}
	if _, ok := s2.Load(key(7)); ok {
		t.Error("an unsaved key hit")
	}
	if st := s2.Stats(); st.Hits != 5 || st.Misses != 1 {
		t.Errorf("hits/misses = %d/%d, want 5/1", st.Hits, st.Misses)
	}
	// And it keeps saving.
	if err := s2.Save(key(5), payload(5, 10)); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, s2)
	if _, ok := s2.Load(key(5)); !ok {
		t.Error("a save after restart is not loadable")
	}
}

func TestSSDRestartKeepsLRUOrder(t *testing.T) {
	dir := t.TempDir()
	clock := newFakeClock()
	s := openSSD(t, SSDConfig{Dir: dir, Clock: clock})
	for i := range 3 {
		clock.Step(time.Minute)
		s.Save(key(i), payload(i, entrySize))
		waitSettled(t, s)
	}
	clock.Step(time.Minute)
	if _, ok := s.Load(key(0)); !ok { // key 0 becomes the most recent
		t.Fatal("miss")
	}
	s.Close(t.Context())

	s2 := openSSD(t, SSDConfig{Dir: dir, Clock: clock})
	// Room for two files: the next save evicts the least recently used (key 1).
	s2.SetQuota(3 * (headerSize + entrySize))
	s2.Save(key(3), payload(3, entrySize))
	waitSettled(t, s2)
	for i, want := range []bool{true, false, true, true} {
		if got := s2.Has(key(i)); got != want {
			t.Errorf("key %d stored = %v, want %v", i, got, want)
		}
	}
}

func TestSSDStatsJSON(t *testing.T) {
	b, err := json.Marshal(SSDStats{})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"saves", "savesPersisted", "errors", "hits", "misses", "evictions", "unlinkFailures", "inlineFallbacks"} {
		if _, ok := m[k]; !ok {
			t.Errorf("SSDStats JSON lacks %q: %s", k, b)
		}
	}
}

// TestSSDQuotaNeverExceeded saves states of assorted sizes with foreign files (another
// model, another format, a stray file) present: after every save the cache directory
// holds no more than the quota, and foreign files go before any of our own entries.
func TestSSDQuotaNeverExceeded(t *testing.T) {
	tests := []struct {
		name  string
		quota int64
		free  int64 // fake free disk
	}{
		{"configured quota binds", 20_000, 1 << 40},
		{"free disk binds", 1 << 40, 20_000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			old := time.Now().Add(-time.Hour)
			foreign := []string{
				filepath.Join(dir, "other-model-0123456789abcdef", entryFileName(key(1), 1)),
				filepath.Join(dir, "tiny-model-fedcba9876543210", entryFileName(key(2), 2)),
				filepath.Join(dir, "stray.bin"),
			}
			for i, p := range foreign {
				writeForeign(t, p, 3000, old.Add(time.Duration(i)*time.Second))
			}
			disk := &fakeDisk{free: tt.free}
			s := openSSD(t, SSDConfig{Dir: dir, QuotaBytes: tt.quota, Statfs: disk.Statfs, QueueDepth: 1})
			quota := s.Stats().QuotaBytes
			if quota > tt.quota || quota > int64(DiskShare*float64(9000+tt.free)) {
				t.Fatalf("quota %d above min(%d, 0.99×(9000+%d))", quota, tt.quota, tt.free)
			}
			ownEvicted := false
			for i := range 60 {
				size := 500 + (i*997)%3000
				if err := s.Save(key(100+i), payload(i, size)); err != nil {
					t.Fatalf("Save %d: %v", i, err)
				}
				st := waitSettled(t, s)
				used, _ := diskUsage(t, dir)
				if used > quota {
					t.Fatalf("save %d: %d bytes on disk, quota %d (%+v)", i, used, quota, st)
				}
				if st.Bytes+st.ForeignBytes != used {
					t.Fatalf("save %d: tracked %d+%d bytes, %d on disk", i, st.Bytes, st.ForeignBytes, used)
				}
				remaining := 0
				for _, p := range foreign {
					if _, err := os.Stat(p); err == nil {
						remaining++
					}
				}
				if st.Evictions > int64(3-remaining) {
					ownEvicted = true
					if remaining > 0 {
						t.Fatalf("save %d: own entries evicted while %d foreign files remain", i, remaining)
					}
				}
			}
			st := s.Stats()
			if !ownEvicted || st.SavesPersisted < 50 || st.QuotaRejects != 0 {
				t.Errorf("expected LRU turnover with every save persisted: %+v", st)
			}
		})
	}
}

// TestSSDDiskSampleInterval: the free disk is read at most every 30 s, and at once
// after ENOSPC, which recomputes the quota without losing persisted entries.
func TestSSDDiskSampleAndENOSPC(t *testing.T) {
	clock := newFakeClock()
	disk := &fakeDisk{free: 1 << 30}
	var failMu sync.Mutex
	fail := false
	write := func(path string, header, payload []byte, sync bool) error {
		failMu.Lock()
		f := fail
		failMu.Unlock()
		if f {
			return &os.PathError{Op: "write", Path: path, Err: syscall.ENOSPC}
		}
		return writeEntryFile(path, header, payload, sync)
	}
	s := openSSD(t, SSDConfig{Clock: clock, Statfs: disk.Statfs, writeFile: write})
	if got := disk.count(); got != 1 {
		t.Fatalf("Open read the disk %d times, want 1", got)
	}
	for i := range 10 {
		clock.Step(2 * time.Second)
		s.Save(key(i), payload(i, entrySize))
		waitSettled(t, s)
	}
	if got := disk.count(); got != 1 {
		t.Errorf("20 s of saves read the disk %d times, want 1", got)
	}
	clock.Step(10 * time.Second) // 30 s since Open
	s.Save(key(10), payload(10, entrySize))
	waitSettled(t, s)
	if got := disk.count(); got != 2 {
		t.Errorf("a save 30 s after the last reading: %d readings, want 2", got)
	}

	// Someone else fills the disk; our stale reading lets a write run into ENOSPC.
	disk.set(100)
	failMu.Lock()
	fail = true
	failMu.Unlock()
	before := s.Stats()
	err := s.Save(key(11), payload(11, entrySize))
	if err != nil {
		t.Fatalf("queued Save returned %v", err)
	}
	st := waitSettled(t, s)
	if st.Errors != 1 {
		t.Fatalf("errors = %d, want 1", st.Errors)
	}
	if got := disk.count(); got != 3 {
		t.Errorf("ENOSPC did not force a reading: %d readings, want 3", got)
	}
	wantQuota := int64(DiskShare * float64(before.Bytes+100))
	if st.QuotaBytes != wantQuota || st.FreeBytes != 100 {
		t.Errorf("after ENOSPC quota = %d, free = %d; want %d, 100", st.QuotaBytes, st.FreeBytes, wantQuota)
	}
	if st.Entries != 11 || st.Evictions != 0 {
		t.Errorf("ENOSPC lost entries: %+v", st)
	}
	for i := range 11 {
		if got, ok := s.Load(key(i)); !ok || !bytes.Equal(got, payload(i, entrySize)) {
			t.Errorf("key %d lost after ENOSPC", i)
		}
	}
	if ents, _ := os.ReadDir(s.Dir()); len(ents) != 11 {
		t.Errorf("%d files after ENOSPC, want 11 (no temporary left)", len(ents))
	}
}

// TestSSDQueueSaturationWritesInline: with the writer stuck and the queue full, a save
// waits QueueWait, then writes inline and counts it; nothing is dropped.
func TestSSDQueueSaturationWritesInline(t *testing.T) {
	g := newGate(func(n int) bool { return n == 1 }) // only the writer's first write blocks
	s := openSSD(t, SSDConfig{QueueDepth: 1, QueueWait: 50 * time.Millisecond, writeFile: g.writeFile})
	s.Save(key(0), payload(0, entrySize))
	eventually(t, 5*time.Second, "the writer to take the first save", func() bool { return g.count() == 1 })
	s.Save(key(1), payload(1, entrySize)) // fills the queue
	start := time.Now()
	if err := s.Save(key(2), payload(2, entrySize)); err != nil {
		t.Fatalf("inline save: %v", err)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Errorf("inline fallback after %s, want after the 50ms queue wait", waited)
	}
	st := s.Stats()
	if st.InlineFallbacks != 1 || !s.Has(key(2)) || st.Queued != 1 {
		t.Errorf("after saturation: %+v, key 2 stored %v", st, s.Has(key(2)))
	}
	g.open()
	st = waitSettled(t, s)
	if st.SavesPersisted != 3 || st.Errors != 0 {
		t.Errorf("after release: %+v, want 3 persisted", st)
	}
	for i := range 3 {
		if _, ok := s.Load(key(i)); !ok {
			t.Errorf("key %d dropped", i)
		}
	}
}

// TestSSDBurstEvictionCapped: a quota cut far below the stored bytes is drained at most
// 32 files per save, and converges over later saves.
func TestSSDBurstEvictionCapped(t *testing.T) {
	file := int64(headerSize + entrySize)
	s := openSSD(t, SSDConfig{QuotaBytes: 100 * file})
	for i := range 100 {
		s.Save(key(i), payload(i, entrySize))
	}
	waitSettled(t, s)
	s.SetQuota(10 * file)

	type step struct{ evictions, files, rejects int64 }
	var got []step
	for i := range 4 {
		s.Save(key(1000+i), payload(i, entrySize))
		st := waitSettled(t, s)
		_, files := diskUsage(t, s.Dir())
		got = append(got, step{st.Evictions, int64(files), st.QuotaRejects})
	}
	want := []step{
		{32, 68, 1}, // 68 files still over 10: this save does not fit
		{64, 36, 2},
		{91, 10, 2}, // 4 would do for the quota, but 27 more make room for the save itself
		{92, 10, 2}, // steady state: one in, one out
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(step{})); diff != "" {
		t.Errorf("eviction steps (-want +got):\n%s", diff)
	}
	if st := s.Stats(); st.Bytes > 10*file {
		t.Errorf("%d bytes over quota %d", st.Bytes, 10*file)
	}
	// The survivors are the most recently saved.
	for _, k := range []int{1002, 1003, 99, 92} {
		if !s.Has(key(k)) {
			t.Errorf("key %d evicted before older ones", k)
		}
	}
	if s.Has(key(91)) {
		t.Error("key 91 outlived newer keys")
	}
}

// TestSSDCorruptFileIsAMiss: truncated, flipped or misnamed files are misses, removed,
// and never a panic — when read, and when found on Open.
func TestSSDCorruptFileIsAMiss(t *testing.T) {
	tests := []struct {
		name    string
		damage  func(t *testing.T, path string)
		renamed bool // the file moved to key 0's name (only Open reads it)
	}{
		{name: "truncated payload", damage: func(t *testing.T, p string) { truncate(t, p, headerSize+entrySize/2) }},
		{name: "truncated header", damage: func(t *testing.T, p string) { truncate(t, p, headerSize/2) }},
		{name: "empty", damage: func(t *testing.T, p string) { truncate(t, p, 0) }},
		{name: "payload bit flip", damage: func(t *testing.T, p string) { flip(t, p, headerSize+10) }},
		{name: "header bit flip", damage: func(t *testing.T, p string) { flip(t, p, 75) }},
		{name: "extended", damage: func(t *testing.T, p string) { appendBytes(t, p, []byte("junk")) }},
		{name: "renamed to another key", renamed: true, damage: func(t *testing.T, p string) {
			if err := os.Rename(p, filepath.Join(filepath.Dir(p), entryFileName(key(0), 1))); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		for _, onOpen := range []bool{false, true} {
			if tt.renamed && !onOpen {
				continue
			}
			name := tt.name
			if onOpen {
				name += " found on open"
			}
			t.Run(name, func(t *testing.T) {
				dir := t.TempDir()
				s := openSSD(t, SSDConfig{Dir: dir})
				s.Save(key(0), payload(0, entrySize))
				s.Save(key(1), payload(1, entrySize))
				waitSettled(t, s)
				paths := filesOf(t, s, key(1))
				if len(paths) != 1 {
					t.Fatalf("files of key 1: %v", paths)
				}
				if tt.renamed {
					if _, err := s.Forget(key(0)); err != nil {
						t.Fatal(err)
					}
				}
				tt.damage(t, filepath.Join(s.Dir(), paths[0]))
				if onOpen {
					s.Close(t.Context())
					s = openSSD(t, SSDConfig{Dir: dir})
				}
				if _, ok := s.Load(key(1)); ok {
					t.Error("damaged key 1 hit")
				}
				data, ok := s.Load(key(0))
				switch {
				case tt.renamed && ok:
					t.Error("key 0 served key 1's state")
				case !tt.renamed && (!ok || !bytes.Equal(data, payload(0, entrySize))):
					t.Error("intact key 0 lost")
				}
				if st := s.Stats(); st.Corrupt != 1 {
					t.Errorf("corrupt = %d, want 1 (%+v)", st.Corrupt, st)
				}
				if got := filesOf(t, s, key(1)); len(got) > 0 {
					t.Errorf("damaged file of key 1 not removed: %v", got)
				}
				if got := filesOf(t, s, key(0)); tt.renamed && len(got) > 0 {
					t.Errorf("impostor file not removed: %v", got)
				}
				// The tier still works.
				s.Save(key(1), payload(1, entrySize))
				waitSettled(t, s)
				if data, ok := s.Load(key(1)); !ok || !bytes.Equal(data, payload(1, entrySize)) {
					t.Error("key 1 not usable after the damage")
				}
			})
		}
	}
}

func truncate(t *testing.T, p string, n int64) {
	t.Helper()
	if err := os.Truncate(p, n); err != nil {
		t.Fatal(err)
	}
}

func flip(t *testing.T, p string, at int) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[at] ^= 0x10
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func appendBytes(t *testing.T, p string, extra []byte) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(extra); err != nil {
		t.Fatal(err)
	}
}

// TestSSDCleanupVersusInFlightWrite: Forget and Clear racing the writer leave no file
// of the forgotten keys, whatever the writer was doing. Run with -race.
func TestSSDCleanupVersusInFlightWrite(t *testing.T) {
	s := openSSD(t, SSDConfig{QueueDepth: 2})
	const rounds = 300
	for r := range rounds {
		k := key(r)
		var wg sync.WaitGroup
		// A few saves of neighbouring keys keep the writer busy at varying points.
		wg.Go(func() { s.Save(key(rounds+r), payload(r, 64<<10)) })
		s.Save(k, payload(r, 64<<10))
		if r%2 == 0 {
			jitter(r)
		}
		if r%10 == 9 {
			if _, _, err := s.Clear(); err != nil {
				t.Fatalf("round %d: Clear: %v", r, err)
			}
			wg.Wait()
			// Everything saved before the clear is gone; the concurrent save may
			// have been accepted after it.
			if left := filesOf(t, s, k); len(left) > 0 {
				t.Fatalf("round %d: files survived Clear: %v", r, left)
			}
			continue
		}
		if _, err := s.Forget(k); err != nil {
			t.Fatalf("round %d: Forget: %v", r, err)
		}
		if left := filesOf(t, s, k); len(left) > 0 {
			t.Fatalf("round %d: files survived Forget: %v", r, left)
		}
		if s.Has(k) {
			t.Fatalf("round %d: forgotten key still indexed", r)
		}
		wg.Wait()
	}
	st := waitSettled(t, s)
	if st.Cancelled == 0 {
		t.Errorf("no save was ever cancelled in flight or queued: %+v", st)
	}
	// The index and the directory agree at the end.
	_, files := diskUsage(t, s.Dir())
	if files != st.Entries {
		t.Errorf("%d files on disk, %d indexed", files, st.Entries)
	}
}

// jitter varies where the writer is when the cleanup comes.
func jitter(r int) {
	for range r % 7 {
		time.Sleep(time.Duration(r%3) * 100 * time.Microsecond)
	}
}

// TestSSDForgetWaitsForTheWriter pins the writer inside a write and checks Forget
// waits for it (and times out cleanly), Clear likewise, and that a Forget of a key
// with nothing pending leaves nothing behind that would cancel a later save.
func TestSSDForgetWaitsForTheWriter(t *testing.T) {
	t.Run("forget waits", func(t *testing.T) {
		g := newGate(nil)
		s := openSSD(t, SSDConfig{writeFile: g.writeFile})
		s.Save(key(0), payload(0, entrySize))
		s.Save(key(1), payload(1, entrySize)) // queued behind it
		eventually(t, 5*time.Second, "the write to start", func() bool { return g.count() == 1 })
		done := make(chan error)
		go func() { _, err := s.Forget(key(0), key(1)); done <- err }()
		select {
		case err := <-done:
			t.Fatalf("Forget returned %v while the write was in flight", err)
		case <-time.After(50 * time.Millisecond):
		}
		g.open()
		if err := <-done; err != nil {
			t.Fatalf("Forget: %v", err)
		}
		if left := append(filesOf(t, s, key(0)), filesOf(t, s, key(1))...); len(left) > 0 {
			t.Errorf("files survived: %v", left)
		}
		if st := waitSettled(t, s); st.Cancelled != 2 || st.SavesPersisted != 0 {
			t.Errorf("stats %+v, want 2 cancelled", st)
		}
	})
	t.Run("forget times out and the write cleans up after itself", func(t *testing.T) {
		g := newGate(nil)
		s := openSSD(t, SSDConfig{writeFile: g.writeFile, ForgetWait: 20 * time.Millisecond})
		s.Save(key(0), payload(0, entrySize))
		eventually(t, 5*time.Second, "the write to start", func() bool { return g.count() == 1 })
		if _, err := s.Forget(key(0)); !errors.Is(err, ErrWaitTimeout) {
			t.Fatalf("Forget = %v, want ErrWaitTimeout", err)
		}
		g.open()
		waitSettled(t, s)
		if left := filesOf(t, s, key(0)); len(left) > 0 {
			t.Errorf("files survived: %v", left)
		}
	})
	t.Run("clear waits", func(t *testing.T) {
		g := newGate(func(n int) bool { return n == 2 })
		s := openSSD(t, SSDConfig{writeFile: g.writeFile})
		s.Save(key(0), payload(0, entrySize))
		s.Save(key(1), payload(1, entrySize))
		eventually(t, 5*time.Second, "the second write to start", func() bool { return g.count() == 2 })
		go func() {
			time.Sleep(30 * time.Millisecond)
			g.open()
		}()
		b, n, err := s.Clear()
		if err != nil {
			t.Fatal(err)
		}
		if b != headerSize+entrySize || n != 1 {
			t.Errorf("Clear = %d bytes, %d entries; want %d, 1", b, n, headerSize+entrySize)
		}
		if _, files := diskUsage(t, s.Dir()); files != 0 {
			t.Errorf("%d files survived Clear", files)
		}
	})
	t.Run("no marker without pending work", func(t *testing.T) {
		s := openSSD(t, SSDConfig{})
		if n, err := s.Forget(key(5)); n != 0 || err != nil {
			t.Fatalf("Forget of nothing = %d, %v", n, err)
		}
		s.Save(key(5), payload(5, entrySize))
		if st := waitSettled(t, s); st.SavesPersisted != 1 || st.Cancelled != 0 {
			t.Errorf("save after an empty Forget: %+v", st)
		}
		if !s.Has(key(5)) {
			t.Error("the save was cancelled by an earlier Forget")
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.pending) != 0 {
			t.Errorf("pending items left: %d", len(s.pending))
		}
	})
}

// TestSSDUnlinkFailure: a victim that cannot be removed is counted and kept in the
// accounting, and the save that needed the room does not break the quota.
func TestSSDUnlinkFailure(t *testing.T) {
	dir := t.TempDir()
	file := int64(headerSize + entrySize)
	s := openSSD(t, SSDConfig{Dir: dir, QuotaBytes: 2 * file})
	s.Save(key(0), payload(0, entrySize))
	s.Save(key(1), payload(1, entrySize))
	waitSettled(t, s)
	// Replace key 0's file by a non-empty directory: unlink fails with ENOTEMPTY.
	p := filepath.Join(s.Dir(), filesOf(t, s, key(0))[0])
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(p, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	s.Save(key(2), payload(2, entrySize))
	st := waitSettled(t, s)
	if st.UnlinkFailures != 1 || st.QuotaRejects != 1 || st.SavesPersisted != 2 {
		t.Errorf("stats %+v, want 1 unlink failure and the save rejected", st)
	}
	if st.Bytes+st.ForeignBytes > 2*file {
		t.Errorf("tracked %d bytes over quota %d", st.Bytes+st.ForeignBytes, 2*file)
	}
	if !s.Has(key(1)) {
		t.Error("key 1 lost")
	}
	// Once the obstacle is gone the next save goes through.
	if err := os.RemoveAll(p); err != nil {
		t.Fatal(err)
	}
	s.Save(key(3), payload(3, entrySize))
	if st := waitSettled(t, s); st.SavesPersisted != 3 {
		t.Errorf("after the obstacle went: %+v", st)
	}
	if !slices.Equal(filesOf(t, s, key(2)), nil) || len(filesOf(t, s, key(3))) != 1 {
		t.Errorf("files: key 2 %v, key 3 %v", filesOf(t, s, key(2)), filesOf(t, s, key(3)))
	}
}

// TestSSDClose: Close persists what is queued; with its context ended while the
// writer is stuck, it returns at once, cancels the queued writes, and the stuck write
// still lands.
func TestSSDClose(t *testing.T) {
	t.Run("drains the queue", func(t *testing.T) {
		dir := t.TempDir()
		s, err := Open(SSDConfig{Dir: dir, Identity: testID, QueueDepth: 8})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 8 {
			s.Save(key(i), payload(i, 64<<10))
		}
		if err := s.Close(t.Context()); err != nil {
			t.Fatal(err)
		}
		if st := s.Stats(); st.SavesPersisted != 8 || !settled(st) {
			t.Errorf("after Close: %+v", st)
		}
		if err := s.Close(t.Context()); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
	t.Run("context ends first", func(t *testing.T) {
		g := newGate(func(n int) bool { return n == 1 })
		s, err := Open(SSDConfig{Dir: t.TempDir(), Identity: testID, QueueDepth: 8, writeFile: g.writeFile})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			s.Save(key(i), payload(i, entrySize))
		}
		eventually(t, 5*time.Second, "the first write to start", func() bool { return g.count() == 1 })
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
		defer cancel()
		if err := s.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close = %v, want the context's error", err)
		}
		g.open()
		st := waitSettled(t, s)
		if st.SavesPersisted != 1 || st.Cancelled != 3 {
			t.Errorf("after Close: %+v, want the in-flight write persisted and 3 cancelled", st)
		}
		if _, files := diskUsage(t, s.Dir()); files != 1 {
			t.Errorf("%d files, want 1", files)
		}
	})
}

// TestSSDSaveLater: a key handed to SaveLater is pending at once — before the returned
// function queues it — so a prefix table refreshed in between still finds the state of
// a hot tier that refused it (over its budget); the write then lands, a duplicate is
// skipped, and after Close the function reports ErrClosed.
func TestSSDSaveLater(t *testing.T) {
	s := openSSD(t, SSDConfig{Dir: t.TempDir(), Identity: testID})
	hot := NewHot(0) // refuses every state, as a runner's hot tier with no budget does
	where := func(k Key) Tier {
		switch {
		case hot.Has(k):
			return TierHot
		case s.Holds(k):
			return TierSSD
		}
		return TierNone
	}
	table := NewPrefixTable("e")
	full := key(1)
	if hot.Put(full, payload(1, entrySize)) {
		t.Fatal("a hot tier without budget took a state")
	}
	queue := s.SaveLater(full, payload(1, entrySize))
	table.Associate([]string{"00000000000000d1"}, Backing{State: full, Tokens: 100})
	table.Refresh(where) // what the runner's tracker does at once after a save
	if got, _ := table.Answer("", 0); len(got.Events) != 1 || got.Events[0].Tier != string(TierSSD) {
		t.Fatalf("before the write is queued the table answers %+v, want the digest held on the SSD", got)
	}
	if err := queue(); err != nil {
		t.Fatal(err)
	}
	if st := waitSettled(t, s); st.SavesPersisted != 1 {
		t.Fatalf("after the queued write: %+v", st)
	}
	table.Refresh(where)
	if got, _ := table.Answer("", 0); len(got.Events) != 1 || got.Events[0].Tier != string(TierSSD) {
		t.Errorf("once written the table answers %+v, want the digest still held on the SSD", got)
	}
	if err := s.SaveLater(full, payload(1, entrySize))(); err != nil {
		t.Errorf("a duplicate: %v", err)
	}
	if st := s.Stats(); st.Duplicates != 1 || st.SavesPersisted != 1 {
		t.Errorf("a duplicate was not skipped: %+v", st)
	}
	if err := s.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveLater(key(2), payload(2, entrySize))(); !errors.Is(err, ErrClosed) {
		t.Errorf("SaveLater after Close = %v, want ErrClosed", err)
	}
}
