package store

import (
	"context"
	"errors"
	"fmt"
	"os"
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

// checkSpace fails with *DiskSpaceError when dir's file system has less than need
// bytes available. A file system that cannot say is assumed to have room.
func checkSpace(dir string, need uint64) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return nil
	}
	free := uint64(st.Bavail) * uint64(st.Bsize) //nolint:unconvert // the field types differ between darwin and linux
	if free < need {
		return &DiskSpaceError{Dir: dir, Need: need, Free: free}
	}
	return nil
}
