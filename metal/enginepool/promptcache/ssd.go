package promptcache

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Clock is the time source (k8s.io/utils/clock.PassiveClock satisfies it).
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Defaults of SSDConfig.
const (
	DefaultQueueDepth          = 4
	DefaultQueueWait           = time.Second
	DefaultDiskSampleInterval  = 30 * time.Second
	DefaultMaxEvictionsPerSave = 32
	DefaultForgetWait          = 2 * time.Second
	DefaultClearWait           = 5 * time.Second
	// DiskShare is the share of (tracked + free disk) the quota may use.
	DiskShare = 0.99
)

// ErrClosed is returned by Save after Close.
var ErrClosed = errors.New("prompt cache closed")

// ErrWaitTimeout is returned by Forget and Clear when the writer's in-flight item did
// not finish in time; the item removes its own file when it does finish.
var ErrWaitTimeout = errors.New("timed out waiting for the prompt cache writer")

// SSDConfig configures an SSD tier.
type SSDConfig struct {
	// Dir is the cache directory shared by all models (the agent's cache dir). It must
	// be dedicated to the prompt cache: every file under it counts toward the quota,
	// and files that are not this identity's entries are evicted first.
	Dir string
	// Identity selects this tier's directory (Dir/Identity.DirName()).
	Identity Identity
	// QuotaBytes is the configured quota; <= 0 leaves only the disk bound. The
	// effective quota is min(QuotaBytes, 0.99 × (tracked bytes + free disk)).
	QuotaBytes int64
	// QueueDepth bounds the writes waiting for the writer (default 4).
	QueueDepth int
	// QueueWait is how long a save waits for room in a full queue before writing
	// inline (default 1 s).
	QueueWait time.Duration
	// DiskSampleInterval is the least time between two reads of the free disk space
	// (default 30 s); an ENOSPC forces a read.
	DiskSampleInterval time.Duration
	// MaxEvictionsPerSave caps the files one save unlinks (default 32).
	MaxEvictionsPerSave int
	// ForgetWait and ClearWait bound how long Forget and Clear wait for an in-flight
	// write (defaults 2 s and 5 s).
	ForgetWait, ClearWait time.Duration
	// RefreshInterval is the longest a lookup trusts a reading of the directory whose
	// modification time did not change, to learn of the states other processes
	// sharing it saved and removed (default 1 s; see ssd_shared.go).
	RefreshInterval time.Duration
	// Sync fsyncs every file before it is renamed into place. Off by default: a file
	// torn by a crash fails its checksum and is a miss, so durability buys nothing
	// but write latency.
	Sync bool
	// Statfs returns the free bytes of the file system holding a path (default
	// FreeBytes).
	Statfs func(path string) (int64, error)
	// Clock defaults to the wall clock.
	Clock Clock

	// writeFile replaces writeEntryFile in tests (error injection, blocking).
	writeFile func(path string, header, payload []byte, sync bool) error
}

// SSDStats is a snapshot of the SSD tier, for /api/status and /metrics.
type SSDStats struct {
	// Saves counts saves accepted. At rest Saves = SavesPersisted + Duplicates +
	// QuotaRejects + Cancelled + Errors.
	Saves int64 `json:"saves"`
	// SavesPersisted counts files renamed into place.
	SavesPersisted int64 `json:"savesPersisted"`
	// Duplicates counts saves of a key already stored or pending (not written again).
	Duplicates int64 `json:"duplicates"`
	// QuotaRejects counts saves that did not fit under the quota after this save's
	// evictions (the state stays in the hot tier).
	QuotaRejects int64 `json:"quotaRejects"`
	// Cancelled counts saves dropped by Forget or Clear before they persisted.
	Cancelled int64 `json:"cancelled"`
	// Errors counts failed writes (ENOSPC included).
	Errors int64 `json:"errors"`
	Hits   int64 `json:"hits"`
	Misses int64 `json:"misses"`
	// Corrupt counts files found invalid (each also a miss when read), all removed.
	Corrupt         int64 `json:"corrupt"`
	Evictions       int64 `json:"evictions"`
	UnlinkFailures  int64 `json:"unlinkFailures"`
	InlineFallbacks int64 `json:"inlineFallbacks"`

	Entries int `json:"entries"`
	// Bytes is this identity's files; ForeignBytes the other files under Dir.
	Bytes        int64 `json:"bytes"`
	ForeignBytes int64 `json:"foreignBytes"`
	ForeignFiles int   `json:"foreignFiles"`
	// QuotaBytes is the effective quota; FreeBytes the last free-disk reading (-1
	// when it failed).
	QuotaBytes int64 `json:"quotaBytes"`
	FreeBytes  int64 `json:"freeBytes"`
	Queued     int   `json:"queued"`
}

// SSD is the on-disk tier of one identity. All methods are safe for concurrent use.
type SSD struct {
	cfg    SSDConfig
	dir    string
	idHash [32]byte

	queue      chan *item
	stop       chan struct{}
	writerDone chan struct{}
	savers     sync.WaitGroup

	// sampleMu serializes free-disk readings (which do I/O outside mu).
	sampleMu sync.Mutex
	// refreshMu serializes readings of the directory (refresh).
	refreshMu sync.Mutex

	mu       sync.Mutex
	closed   bool
	entries  map[Key]*entry
	lru      list.List // of *entry, front = most recently used
	foreign  []*entry  // oldest first
	pending  map[Key][]*item
	ownBytes int64
	forBytes int64
	reserved int64
	// diskCap is tracked + free bytes at the last reading, -1 if it failed.
	diskCap    int64
	freeBytes  int64
	lastSample time.Time
	// gen counts the entries indexed (each entry's gen is its number); lastRefresh
	// is the last reading of the directory and dirMtime the directory's modification
	// time before it; unlinking the paths this process dropped and is removing.
	gen         uint64
	lastRefresh time.Time
	dirMtime    time.Time
	unlinking   map[string]bool
	st          SSDStats
}

type entry struct {
	key     Key
	path    string
	size    int64
	lastUse time.Time
	elem    *list.Element
	gen     uint64
}

type itemState int

const (
	itemQueued itemState = iota
	itemWriting
	itemDone
)

type item struct {
	key       Key
	data      []byte
	state     itemState
	cancelled bool
	done      chan struct{}
	err       error
}

// Open opens (creating it if needed) the SSD tier of cfg.Identity under cfg.Dir,
// rebuilds the index from the files there (removing corrupt and temporary ones),
// reads the free disk and starts the writer.
func Open(cfg SSDConfig) (*SSD, error) {
	if cfg.Dir == "" {
		return nil, errors.New("prompt cache: no directory")
	}
	if cfg.QueueDepth <= 0 {
		cfg.QueueDepth = DefaultQueueDepth
	}
	if cfg.QueueWait <= 0 {
		cfg.QueueWait = DefaultQueueWait
	}
	if cfg.DiskSampleInterval <= 0 {
		cfg.DiskSampleInterval = DefaultDiskSampleInterval
	}
	if cfg.MaxEvictionsPerSave <= 0 {
		cfg.MaxEvictionsPerSave = DefaultMaxEvictionsPerSave
	}
	if cfg.ForgetWait <= 0 {
		cfg.ForgetWait = DefaultForgetWait
	}
	if cfg.ClearWait <= 0 {
		cfg.ClearWait = DefaultClearWait
	}
	if cfg.RefreshInterval <= 0 {
		cfg.RefreshInterval = DefaultRefreshInterval
	}
	if cfg.Statfs == nil {
		cfg.Statfs = FreeBytes
	}
	if cfg.Clock == nil {
		cfg.Clock = realClock{}
	}
	if cfg.writeFile == nil {
		cfg.writeFile = writeEntryFile
	}
	s := &SSD{
		cfg:        cfg,
		dir:        filepath.Join(cfg.Dir, cfg.Identity.DirName()),
		idHash:     cfg.Identity.Hash(),
		queue:      make(chan *item, cfg.QueueDepth),
		stop:       make(chan struct{}),
		writerDone: make(chan struct{}),
		entries:    map[Key]*entry{},
		pending:    map[Key][]*item{},
		unlinking:  map[string]bool{},
		diskCap:    -1,
		freeBytes:  -1,
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating prompt cache directory: %w", err)
	}
	if err := s.loadIndex(); err != nil {
		return nil, err
	}
	s.sample(true)
	go s.writer()
	return s, nil
}

// Dir is this identity's directory.
func (s *SSD) Dir() string { return s.dir }

// loadIndex indexes this identity's files: valid entries are kept (the newest per
// key), corrupt files and stale temporary ones (staleTemp) removed, anything else
// left as foreign.
func (s *SSD) loadIndex() error {
	if info, err := os.Stat(s.dir); err == nil {
		s.dirMtime = info.ModTime()
	}
	des, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("reading prompt cache directory: %w", err)
	}
	for _, de := range des {
		if !de.Type().IsRegular() {
			continue
		}
		name := de.Name()
		path := filepath.Join(s.dir, name)
		if strings.HasSuffix(name, tempSuffix) {
			if info, err := de.Info(); err == nil && staleTemp(name, info.ModTime()) {
				_ = os.Remove(path)
			}
			continue
		}
		key, ok := parseEntryFileName(name)
		if !ok {
			continue // not ours: picked up by the foreign scan
		}
		info, err := de.Info()
		if err != nil {
			continue
		}
		size, err := checkEntryHeader(path, s.idHash, key)
		if err != nil {
			if errors.Is(err, errCorrupt) {
				s.st.Corrupt++
				_ = os.Remove(path)
			}
			continue
		}
		if old, ok := s.entries[key]; ok {
			// Two files for one key (a crash between rename and cleanup, or two
			// processes of the directory): keep the one every process keeps.
			if !newerFile(listedFile{path, info.ModTime()}, listedFile{old.path, old.lastUse}) {
				_ = os.Remove(path)
				continue
			}
			s.dropEntryLocked(old)
			_ = os.Remove(old.path)
		}
		s.addEntryLocked(&entry{key: key, path: path, size: size, lastUse: info.ModTime()})
	}
	// Rebuild the LRU order from the files' times (most recent first).
	all := make([]*entry, 0, len(s.entries))
	for e := s.lru.Front(); e != nil; e = e.Next() {
		all = append(all, e.Value.(*entry))
	}
	slices.SortStableFunc(all, func(a, b *entry) int { return b.lastUse.Compare(a.lastUse) })
	s.lru.Init()
	for _, en := range all {
		en.elem = s.lru.PushBack(en)
	}
	s.lastRefresh = s.cfg.Clock.Now()
	return nil
}

// scanForeign lists the regular files under Dir that are not this identity's
// entries, oldest first.
func (s *SSD) scanForeign() []*entry {
	var out []*entry
	_ = filepath.WalkDir(s.cfg.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil //nolint:nilerr // unreadable parts are skipped
		}
		if d.IsDir() {
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if filepath.Dir(path) == s.dir {
			name := d.Name()
			if _, ok := parseEntryFileName(name); ok || strings.HasSuffix(name, tempSuffix) {
				return nil
			}
		}
		info, err := d.Info()
		if err != nil {
			return nil //nolint:nilerr // vanished meanwhile
		}
		out = append(out, &entry{path: path, size: info.Size(), lastUse: info.ModTime()})
		return nil
	})
	slices.SortStableFunc(out, func(a, b *entry) int { return a.lastUse.Compare(b.lastUse) })
	return out
}

// Has reports whether key is indexed (its file may still turn out corrupt).
func (s *SSD) Has(key Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.entries[key]
	return ok
}

// Holds reports whether key is indexed or queued to be written (not yet cancelled).
func (s *SSD) Holds(key Key) bool {
	s.refresh(false)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.entries[key]; ok {
		return true
	}
	for _, it := range s.pending[key] {
		if !it.cancelled {
			return true
		}
	}
	return false
}

// Load reads and verifies the state under key. A missing, truncated or corrupt file
// is a miss; a corrupt one is removed.
func (s *SSD) Load(key Key) ([]byte, bool) {
	data, ok := s.load(key)
	s.count(ok)
	return data, ok
}

func (s *SSD) load(key Key) ([]byte, bool) {
	s.mu.Lock()
	e, ok := s.entries[key]
	s.mu.Unlock()
	if !ok {
		// Another process sharing the directory may have saved it since.
		s.refresh(true)
		s.mu.Lock()
		e, ok = s.entries[key]
		s.mu.Unlock()
		if !ok {
			return nil, false
		}
	}
	data, err := readEntry(e.path, s.idHash, key)
	if err != nil {
		s.mu.Lock()
		if errors.Is(err, errCorrupt) {
			s.st.Corrupt++
		}
		indexed := s.entries[key] == e
		if indexed && !errors.Is(err, fs.ErrNotExist) {
			s.dropForUnlinkLocked(e)
		} else if indexed {
			s.dropEntryLocked(e) // another process removed it: a miss
		}
		s.mu.Unlock()
		if indexed && !errors.Is(err, fs.ErrNotExist) {
			s.unlink(e.path)
		}
		return nil, false
	}
	s.mu.Lock()
	if s.entries[key] == e {
		s.touchLocked(e)
	}
	s.mu.Unlock()
	// Keep the LRU order across restarts (Open orders by modification time, so this
	// is wall-clock time like the files' own); failing that only costs order.
	now := time.Now()
	_ = os.Chtimes(e.path, now, now)
	return data, true
}

// deepest loads the deepest of keys[from:] that is stored and valid, returning its
// index or -1, without counting.
func (s *SSD) deepest(keys []Key, from int) (int, []byte) {
	s.refresh(false)
	for i := len(keys) - 1; i >= from; i-- {
		if !s.Has(keys[i]) {
			continue
		}
		if data, ok := s.load(keys[i]); ok {
			return i, data
		}
	}
	return -1, nil
}

func (s *SSD) count(hit bool) {
	s.mu.Lock()
	if hit {
		s.st.Hits++
	} else {
		s.st.Misses++
	}
	s.mu.Unlock()
}

// Stats returns a snapshot of the counters and sizes.
func (s *SSD) Stats() SSDStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Entries = len(s.entries)
	st.Bytes = s.ownBytes
	st.ForeignBytes = s.forBytes
	st.ForeignFiles = len(s.foreign)
	st.QuotaBytes = s.quotaLocked()
	st.FreeBytes = s.freeBytes
	st.Queued = len(s.queue)
	return st
}

// Close stops accepting saves and lets the writer finish the queue. When ctx ends
// first, the writes still queued are cancelled and ctx's error returned at once; a
// write already in flight completes on its own.
func (s *SSD) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.savers.Wait()
	close(s.stop)
	select {
	case <-s.writerDone:
		return nil
	case <-ctx.Done():
	}
	select {
	case <-s.writerDone:
		return nil
	default:
	}
	s.mu.Lock()
	for _, items := range s.pending {
		for _, it := range items {
			if it.state == itemQueued && !it.cancelled {
				it.cancelled = true
				s.st.Cancelled++
			}
		}
	}
	s.mu.Unlock()
	return ctx.Err()
}
