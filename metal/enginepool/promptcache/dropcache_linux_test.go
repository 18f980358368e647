//go:build linux

package promptcache

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

const canDropFileCache = true

// dropFileCache evicts one file's pages from the page cache, so the next read comes
// from the disk (only this file: other work on the machine keeps its cache).
func dropFileCache(b *testing.B, path string) {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		b.Fatal(err)
	}
}
