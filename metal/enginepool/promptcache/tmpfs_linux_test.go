//go:build linux

package promptcache

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestSSDRealENOSPC runs the SSD tier on a 1 MiB tmpfs with the real statfs: another
// writer fills the file system behind the tier's last reading, the next save hits a
// real ENOSPC, the quota is recomputed at once from a fresh reading and every entry
// already persisted stays loadable. Skipped where mounting is not permitted.
func TestSSDRealENOSPC(t *testing.T) {
	mnt := t.TempDir()
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v); the injected-error test covers ENOSPC", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(mnt, 0); err != nil {
			t.Errorf("unmounting %s: %v", mnt, err)
		}
	})
	clock := newFakeClock()
	cfg := SSDConfig{Dir: filepath.Join(mnt, "cache"), Identity: testID, Clock: clock, Statfs: FreeBytes}
	s := openSSD(t, cfg)
	st := s.Stats()
	if st.FreeBytes < 900<<10 || st.QuotaBytes != int64(DiskShare*float64(st.FreeBytes)) {
		t.Fatalf("fresh 1 MiB tmpfs: %+v", st)
	}
	const size = 200 << 10
	for i := range 2 {
		if err := s.Save(key(i), payload(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	if st := waitSettled(t, s); st.SavesPersisted != 2 {
		t.Fatalf("before filling: %+v", st)
	}

	// Fill the file system from outside the cache directory.
	f, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling: %v", err)
			}
			break
		}
	}
	f.Close()

	err = s.Save(key(2), payload(2, size))
	if err != nil {
		t.Fatalf("queued save returned %v", err)
	}
	st = waitSettled(t, s)
	if st.Errors != 1 || st.SavesPersisted != 2 {
		t.Fatalf("after ENOSPC: %+v, want 1 error", st)
	}
	free, err := FreeBytes(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if st.FreeBytes != free || st.QuotaBytes != int64(DiskShare*float64(st.Bytes+free)) {
		t.Errorf("quota not recomputed from a fresh reading: free %d, stats %+v", free, st)
	}
	for i := range 2 {
		if got, ok := s.Load(key(i)); !ok || !bytes.Equal(got, payload(i, size)) {
			t.Errorf("key %d lost after ENOSPC", i)
		}
	}
	if _, files := diskUsage(t, s.Dir()); files != 2 {
		t.Errorf("%d files in the cache directory, want 2 (no temporary left)", files)
	}
}
