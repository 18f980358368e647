package promptcache

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// Forget removes the states under keys (e.g. every key of one conversation): queued
// writes are cancelled, a write in flight is waited for (up to ForgetWait) and
// removes its file itself, stored files are unlinked. Nothing is remembered for keys
// that had nothing pending. It returns the number of stored files removed.
func (s *SSD) Forget(keys ...Key) (int, error) {
	s.mu.Lock()
	var waits []chan struct{}
	var paths []string
	for _, k := range keys {
		w, p := s.cancelLocked(k)
		waits = append(waits, w...)
		paths = append(paths, p...)
	}
	s.mu.Unlock()
	for _, p := range paths {
		s.unlink(p)
	}
	return len(paths), waitAll(waits, s.cfg.ForgetWait)
}

// cancelLocked cancels every pending item of k and drops its entry; it returns the
// done channels of items being written and the path to unlink.
func (s *SSD) cancelLocked(k Key) (waits []chan struct{}, paths []string) {
	for _, it := range slices.Clone(s.pending[k]) {
		if it.cancelled {
			if it.state == itemWriting {
				waits = append(waits, it.done)
			}
			continue
		}
		it.cancelled = true
		switch it.state {
		case itemWriting:
			waits = append(waits, it.done)
		case itemQueued:
			// The writer skips it; nothing else refers to it.
			s.st.Cancelled++
			s.removePendingLocked(it)
		}
	}
	if e, ok := s.entries[k]; ok {
		s.dropForUnlinkLocked(e)
		paths = append(paths, e.path)
	}
	return waits, paths
}

// Clear removes every state of this identity: pending writes are cancelled, writes
// in flight waited for (up to ClearWait), files unlinked. It returns the bytes and
// entries removed.
func (s *SSD) Clear() (bytes int64, entries int, err error) {
	s.mu.Lock()
	var waits []chan struct{}
	var paths []string
	keys := make([]Key, 0, len(s.entries)+len(s.pending))
	for k := range s.entries {
		keys = append(keys, k)
	}
	for k := range s.pending {
		if _, ok := s.entries[k]; !ok {
			keys = append(keys, k)
		}
	}
	bytes = s.ownBytes
	for _, k := range keys {
		w, p := s.cancelLocked(k)
		waits = append(waits, w...)
		paths = append(paths, p...)
	}
	s.mu.Unlock()
	for _, p := range paths {
		s.unlink(p)
	}
	err = waitAll(waits, s.cfg.ClearWait)
	// Files this process does not index (another runner of the same identity, or
	// left by a write that outlived the wait) go too.
	if des, rerr := os.ReadDir(s.dir); rerr == nil {
		s.mu.Lock()
		indexed := make(map[string]bool, len(s.entries))
		for _, e := range s.entries {
			indexed[e.path] = true // saved after the clear began
		}
		s.mu.Unlock()
		for _, de := range des {
			p := filepath.Join(s.dir, de.Name())
			if _, ok := parseEntryFileName(de.Name()); ok && !indexed[p] {
				s.unlink(p)
			}
		}
	}
	return bytes, len(paths), err
}

func waitAll(waits []chan struct{}, d time.Duration) error {
	if len(waits) == 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for _, w := range waits {
		select {
		case <-w:
		case <-t.C:
			return fmt.Errorf("%w after %s", ErrWaitTimeout, d)
		}
	}
	return nil
}
