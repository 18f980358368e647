package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
)

// lockPoll is how often a Fetch checks whether another process released a partial file.
const lockPoll = 100 * time.Millisecond

// lockFile takes an exclusive flock on f, waiting while another process (or another
// open of the file) holds it, until ctx is done. Closing f releases it.
func lockFile(ctx context.Context, f *os.File, log logr.Logger) error {
	var t *time.Ticker
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("locking %s: %w", f.Name(), err)
		}
		if t == nil {
			log.V(2).Info("Waiting for another download of the same file", "path", f.Name())
			t = time.NewTicker(lockPoll)
			defer t.Stop()
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}

// checkSpace fails with *DiskSpaceError when the store has less than need bytes
// available: on the blobs' file system, and under Capacity when it is set. A file
// system that cannot say is assumed to have room.
func (s *Store) checkSpace(need uint64) error {
	free, known := uint64(0), false
	var st unix.Statfs_t
	if err := unix.Statfs(s.blobs, &st); err == nil {
		free, known = uint64(st.Bavail)*uint64(st.Bsize), true //nolint:unconvert // the field types differ between darwin and linux
	}
	if s.capacity > 0 {
		left := uint64(max(s.capacity-dirBytes(s.dir), 0))
		if !known || left < free {
			free, known = left, true
		}
	}
	if known && free < need {
		return &DiskSpaceError{Dir: s.dir, Need: need, Free: free}
	}
	return nil
}

// dirBytes is the size of the regular files under dir (those it can read).
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if info, err := d.Info(); err == nil {
			n += info.Size()
		}
		return nil
	})
	return n
}
