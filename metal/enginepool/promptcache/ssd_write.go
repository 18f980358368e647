package promptcache

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// sample re-reads the foreign files and the free disk when forced or when the last
// reading is DiskSampleInterval old.
func (s *SSD) sample(force bool) {
	s.sampleMu.Lock()
	defer s.sampleMu.Unlock()
	now := s.cfg.Clock.Now()
	s.mu.Lock()
	due := force || s.lastSample.IsZero() || now.Sub(s.lastSample) >= s.cfg.DiskSampleInterval
	s.mu.Unlock()
	if !due {
		return
	}
	foreign := s.scanForeign()
	free, err := s.cfg.Statfs(s.cfg.Dir)

	s.mu.Lock()
	defer s.mu.Unlock()
	s.foreign = foreign
	s.forBytes = 0
	for _, f := range foreign {
		s.forBytes += f.size
	}
	if err != nil {
		s.diskCap, s.freeBytes = -1, -1
	} else {
		s.freeBytes = free
		s.diskCap = s.usedLocked() + free
	}
	s.lastSample = now
}

func (s *SSD) usedLocked() int64 { return s.ownBytes + s.forBytes + s.reserved }

// quotaLocked is min(configured, 0.99 × (tracked + free)); without a disk reading
// only the configured quota applies (0 when there is none: nothing is persisted).
func (s *SSD) quotaLocked() int64 {
	q := s.cfg.QuotaBytes
	if s.diskCap >= 0 {
		d := int64(DiskShare * float64(s.diskCap))
		if q <= 0 || d < q {
			q = d
		}
	}
	return max(q, 0)
}

// SetQuota changes the configured quota; the next save evicts toward it.
func (s *SSD) SetQuota(quotaBytes int64) {
	s.mu.Lock()
	s.cfg.QuotaBytes = quotaBytes
	s.mu.Unlock()
}

// Save queues data to be written under key. It returns once the write is queued, or,
// when the queue stayed full for QueueWait, after writing it inline (never dropping
// it). A key already stored or pending is not written again. data must not be
// modified afterwards.
func (s *SSD) Save(key Key, data []byte) error {
	return s.SaveLater(key, data)()
}

// SaveLater is Save in two steps, for a caller that must not wait on a full queue but
// must not leave a gap either: the key is pending when SaveLater returns (Holds
// reports it, a duplicate save is skipped), and the returned function, which the
// caller must call exactly once (Close waits for it), queues the write as Save does —
// on the caller's goroutine of choice. Without the first step a state the hot tier
// refused (over its budget) was held by no tier until that goroutine ran, and a
// prefix table refreshed in between forgot it for good.
func (s *SSD) SaveLater(key Key, data []byte) (queue func() error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return func() error { return ErrClosed }
	}
	s.st.Saves++
	if e, ok := s.entries[key]; ok {
		s.st.Duplicates++
		s.touchLocked(e)
		s.mu.Unlock()
		return func() error { return nil }
	}
	for _, it := range s.pending[key] {
		if !it.cancelled {
			s.st.Duplicates++
			s.mu.Unlock()
			return func() error { return nil }
		}
	}
	it := &item{key: key, data: data, done: make(chan struct{})}
	s.pending[key] = append(s.pending[key], it)
	s.savers.Add(1)
	s.mu.Unlock()
	return func() error {
		defer s.savers.Done()
		return s.enqueue(it)
	}
}

// enqueue hands it to the writer, or writes it inline when the queue stayed full for
// QueueWait.
func (s *SSD) enqueue(it *item) error {
	select {
	case s.queue <- it:
		return nil
	default:
	}
	t := time.NewTimer(s.cfg.QueueWait)
	defer t.Stop()
	select {
	case s.queue <- it:
		return nil
	case <-t.C:
	}
	s.mu.Lock()
	s.st.InlineFallbacks++
	s.mu.Unlock()
	s.write(it)
	return it.err
}

func (s *SSD) writer() {
	defer close(s.writerDone)
	for {
		select {
		case it := <-s.queue:
			s.write(it)
		case <-s.stop:
			for {
				select {
				case it := <-s.queue:
					s.write(it)
				default:
					return
				}
			}
		}
	}
}

// write persists one item: evict to make room (at most MaxEvictionsPerSave unlinks),
// write a temporary file, rename it into place, index it. A cancelled item writes
// nothing, or removes its own file if it was cancelled during the write.
func (s *SSD) write(it *item) {
	defer close(it.done)
	s.sample(false)
	// Evict on the directory's real contents: other processes may share it.
	s.refresh(true)

	size := int64(headerSize + len(it.data))
	if !s.makeRoom(it, size) {
		return
	}
	path, ok := s.persist(it, size)
	if !ok {
		return
	}
	s.indexWritten(it, path, size)
}

// makeRoom reserves size bytes for it, unlinking the victims chosen to make room, and
// reports whether the write goes ahead. An item that is cancelled, a duplicate or
// over the quota is finished here.
func (s *SSD) makeRoom(it *item, size int64) bool {
	s.mu.Lock()
	if !s.beginWriteLocked(it) {
		s.mu.Unlock()
		return false
	}
	victims, ok := s.reserveLocked(size)
	s.mu.Unlock()

	if failed := s.unlinkVictims(victims); failed && ok {
		// A victim that could not be removed still holds its bytes.
		s.mu.Lock()
		if s.usedLocked() > s.quotaLocked() {
			s.reserved -= size
			ok = false
		}
		s.mu.Unlock()
	}
	if !ok {
		s.mu.Lock()
		if it.cancelled {
			s.st.Cancelled++
		} else {
			s.st.QuotaRejects++
		}
		s.finishLocked(it)
		s.mu.Unlock()
	}
	return ok
}

// persist writes it to a temporary file and renames it into place, returning the
// entry's path. An item cancelled during the write, or a write that fails, gives back
// its reservation and is finished here.
func (s *SSD) persist(it *item, size int64) (string, bool) {
	path := filepath.Join(s.dir, entryFileName(it.key, rand.Uint32()))
	tmp := path + tempSuffix
	err := s.cfg.writeFile(tmp, encodeHeader(s.idHash, it.key, it.data), it.data, s.cfg.Sync)
	if err == nil {
		s.mu.Lock()
		cancelled := it.cancelled
		s.mu.Unlock()
		if cancelled {
			// Forgotten during the write: never put it in place. (A cancellation
			// after this check is caught after the rename.)
			_ = os.Remove(tmp)
			s.mu.Lock()
			s.reserved -= size
			s.st.Cancelled++
			s.finishLocked(it)
			s.mu.Unlock()
			return "", false
		}
		err = os.Rename(tmp, path)
	}
	if err != nil {
		s.failWrite(it, tmp, size, err)
		return "", false
	}
	return path, true
}

// failWrite removes the temporary file of a failed write, gives back its reservation
// and finishes it with the error.
func (s *SSD) failWrite(it *item, tmp string, size int64, err error) {
	_ = os.Remove(tmp)
	s.mu.Lock()
	s.reserved -= size
	s.mu.Unlock()
	if errors.Is(err, syscall.ENOSPC) {
		// The last reading was wrong: read again now, before the next save.
		s.sample(true)
	}
	s.mu.Lock()
	s.st.Errors++
	it.err = fmt.Errorf("writing prompt cache entry: %w", err)
	s.finishLocked(it)
	s.mu.Unlock()
}

// indexWritten indexes the file now in place at path, replacing an older entry of the
// key, and finishes it; an item cancelled after the rename has its file unlinked.
func (s *SSD) indexWritten(it *item, path string, size int64) {
	s.mu.Lock()
	s.reserved -= size
	if it.cancelled {
		s.st.Cancelled++
		s.finishLocked(it)
		s.mu.Unlock()
		s.unlink(path)
		return
	}
	var replaced string
	if old, ok := s.entries[it.key]; ok {
		if old.path == path {
			s.dropEntryLocked(old) // a refresh indexed the file already
		} else {
			replaced = old.path
			s.dropForUnlinkLocked(old)
		}
	}
	s.addEntryLocked(&entry{key: it.key, path: path, size: size, lastUse: s.cfg.Clock.Now()})
	s.st.SavesPersisted++
	s.finishLocked(it)
	s.mu.Unlock()
	if replaced != "" {
		s.unlink(replaced)
	}
}

// beginWriteLocked marks it as being written, unless it was cancelled or another
// process of the directory saved its key meanwhile (a duplicate): then it is done.
func (s *SSD) beginWriteLocked(it *item) bool {
	if it.cancelled {
		s.finishLocked(it)
		return false
	}
	if _, ok := s.entries[it.key]; ok {
		s.st.Duplicates++
		s.finishLocked(it)
		return false
	}
	it.state = itemWriting
	return true
}

// reserveLocked makes room for size bytes: while the tier would exceed its quota it
// takes victims, foreign files first (oldest first), then this identity's least
// recently used entries, at most MaxEvictionsPerSave of them. The victims leave the
// index now and are unlinked by the caller; when size then fits it is reserved.
func (s *SSD) reserveLocked(size int64) ([]*entry, bool) {
	quota := s.quotaLocked()
	if size > quota {
		return nil, false
	}
	var victims []*entry
	for s.usedLocked()+size > quota && len(victims) < s.cfg.MaxEvictionsPerSave {
		var v *entry
		switch {
		case len(s.foreign) > 0:
			v = s.foreign[0]
			s.foreign = s.foreign[1:]
			s.forBytes -= v.size
		case s.lru.Len() > 0:
			v = s.lru.Back().Value.(*entry)
			s.dropForUnlinkLocked(v)
		default:
			return victims, false
		}
		victims = append(victims, v)
	}
	if s.usedLocked()+size > quota {
		return victims, false
	}
	s.reserved += size
	return victims, true
}

// unlinkVictims removes evicted files; one that cannot be removed goes back to the
// foreign list (its bytes still count) and is reported.
func (s *SSD) unlinkVictims(victims []*entry) (failed bool) {
	for _, v := range victims {
		err := os.Remove(v.path)
		s.mu.Lock()
		delete(s.unlinking, v.path)
		switch {
		case err == nil || errors.Is(err, fs.ErrNotExist):
			s.st.Evictions++
		default:
			failed = true
			s.st.UnlinkFailures++
			v.key = Key{}
			s.foreign = append(s.foreign, v)
			s.forBytes += v.size
		}
		s.mu.Unlock()
	}
	return failed
}

// unlink removes a file this tier no longer indexes, counting a failure.
func (s *SSD) unlink(path string) {
	err := os.Remove(path)
	s.mu.Lock()
	delete(s.unlinking, path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.st.UnlinkFailures++
	}
	s.mu.Unlock()
}

func (s *SSD) finishLocked(it *item) {
	it.state = itemDone
	s.removePendingLocked(it)
}

func (s *SSD) removePendingLocked(it *item) {
	list := s.pending[it.key]
	if i := slices.Index(list, it); i >= 0 {
		list = slices.Delete(list, i, i+1)
	}
	if len(list) == 0 {
		delete(s.pending, it.key)
	} else {
		s.pending[it.key] = list
	}
}

func (s *SSD) addEntryLocked(e *entry) {
	s.gen++
	e.gen = s.gen
	s.entries[e.key] = e
	e.elem = s.lru.PushFront(e)
	s.ownBytes += e.size
}

func (s *SSD) dropEntryLocked(e *entry) {
	if s.entries[e.key] == e {
		delete(s.entries, e.key)
	}
	if e.elem != nil {
		s.lru.Remove(e.elem)
		e.elem = nil
		s.ownBytes -= e.size
	}
}

func (s *SSD) touchLocked(e *entry) {
	e.lastUse = s.cfg.Clock.Now()
	if e.elem != nil {
		s.lru.MoveToFront(e.elem)
	}
}
