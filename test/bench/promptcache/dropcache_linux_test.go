//go:build linux

package promptcache

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

const canDropPageCache = true

// dropPageCache evicts the files under dir from the page cache, so the next read of
// the SSD tier comes from the disk.
func dropPageCache(b *testing.B, dir string) {
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil //nolint:nilerr // best effort
		}
		f, err := os.Open(p)
		if err != nil {
			return nil //nolint:nilerr // vanished meanwhile
		}
		defer f.Close()
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			b.Fatal(err)
		}
		return nil
	})
}
