package promptcache

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// One SSD directory may be shared by several runner processes of the same identity
// (replicas of one model of one namespace on one Mac): each writes its files under
// names of its own (a random nonce) by temporary file and rename, so a reader never
// sees a partial file, and a file another process evicts is either read whole (it
// was open) or missing, a miss. Each process keeps its own index, so it re-reads the
// directory (refresh) to learn of the files the others wrote and removed: before
// every write (its evictions work on the directory's real contents, so the quota
// bounds the directory, not each process), on a lookup when the directory's
// modification time changed since the last reading (a stat: every file added or
// removed changes it) or that reading is RefreshInterval old (for file systems whose
// times are coarse), and when a state it is asked for is not indexed.

// Defaults of the shared directory's bounds.
const (
	// DefaultRefreshInterval is the longest a lookup trusts a reading of the directory
	// whose modification time did not change.
	DefaultRefreshInterval = time.Second
	// StaleTempAge is how old a temporary file must be for Open to remove it: younger
	// ones may be another process's write in progress.
	StaleTempAge = 10 * time.Minute
)

// listedFile is an entry file found in the directory.
type listedFile struct {
	path    string
	modTime time.Time
}

// newerFile says whether a should be kept over b, two files of one key: the newer,
// then the smaller name, so every process sharing the directory keeps the same one.
func newerFile(a, b listedFile) bool {
	if !a.modTime.Equal(b.modTime) {
		return a.modTime.After(b.modTime)
	}
	return a.path < b.path
}

// listing is a reading of the directory: its entry files, one per key (newerFile),
// the others of a key that lost (duplicates to remove), and every path named as an
// entry whatever its type (an index entry whose path is there is not gone, even when
// something else took its place).
type listing struct {
	files   map[Key]listedFile
	losers  []string
	present map[string]bool
}

func (s *SSD) listEntryFiles() (listing, error) {
	des, err := os.ReadDir(s.dir)
	if err != nil {
		return listing{}, err
	}
	files := make(map[Key]listedFile, len(des))
	present := make(map[string]bool, len(des))
	var losers []string
	for _, de := range des {
		key, ok := parseEntryFileName(de.Name())
		if !ok {
			continue
		}
		present[filepath.Join(s.dir, de.Name())] = true
		if !de.Type().IsRegular() {
			continue
		}
		info, err := de.Info()
		if err != nil {
			continue // removed meanwhile
		}
		f := listedFile{path: filepath.Join(s.dir, de.Name()), modTime: info.ModTime()}
		if old, ok := files[key]; ok {
			if !newerFile(f, old) {
				losers = append(losers, f.path)
				continue
			}
			losers = append(losers, old.path)
		}
		files[key] = f
	}
	return listing{files: files, losers: losers, present: present}, nil
}

// refresh makes the index match the directory (see above): entries whose file is
// gone are dropped, files of other processes indexed (their headers checked; corrupt
// ones removed), duplicates of a key removed. Without force it reads the directory
// only when its modification time changed since the last reading or that reading is
// RefreshInterval old.
func (s *SSD) refresh(force bool) {
	s.refreshMu.Lock()
	defer s.refreshMu.Unlock()
	now := s.cfg.Clock.Now()
	var mtime time.Time
	if info, err := os.Stat(s.dir); err == nil {
		mtime = info.ModTime()
	}
	s.mu.Lock()
	due := force || s.lastRefresh.IsZero() || now.Sub(s.lastRefresh) >= s.cfg.RefreshInterval ||
		mtime.IsZero() || !mtime.Equal(s.dirMtime)
	gen := s.gen
	s.mu.Unlock()
	if !due {
		return
	}
	l, err := s.listEntryFiles()
	if err != nil {
		return
	}
	s.mu.Lock()
	var check []Key
	for k, e := range s.entries {
		f, ok := l.files[k]
		gone, lost := !l.present[e.path], ok && f.path != e.path
		if (gone || lost) && e.gen <= gen && !s.unlinking[e.path] {
			// Gone (another process evicted it) or lost to a newer file of its key.
			s.dropEntryLocked(e)
		}
	}
	for k, f := range l.files {
		if e, ok := s.entries[k]; (!ok || e.path != f.path) && !s.unlinking[f.path] {
			check = append(check, k)
		}
	}
	s.lastRefresh, s.dirMtime = now, mtime
	s.mu.Unlock()
	for _, p := range l.losers {
		s.unlink(p)
	}
	for _, k := range check {
		s.adopt(k, l.files[k])
	}
}

// adopt indexes f, another process's file of key, unless it turned out corrupt (then
// removed), gone, or this process indexed or removed the key's file meanwhile.
func (s *SSD) adopt(key Key, f listedFile) {
	size, err := checkEntryHeader(f.path, s.idHash, key)
	if err != nil {
		if errors.Is(err, errCorrupt) {
			s.mu.Lock()
			s.st.Corrupt++
			s.mu.Unlock()
			s.unlink(f.path)
		}
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.entries[key]; ok || s.unlinking[f.path] {
		return
	}
	// Still there under the lock: an unlink of this process marks the path before
	// it lets go of the lock, so a file that passes is not on its way out.
	if _, err := os.Lstat(f.path); errors.Is(err, fs.ErrNotExist) {
		return
	}
	s.addEntryLocked(&entry{key: key, path: f.path, size: size, lastUse: f.modTime})
}

// dropForUnlinkLocked drops e from the index and marks its path as being unlinked by
// this process (unlink clears the mark), so a refresh meanwhile does not index it
// again.
func (s *SSD) dropForUnlinkLocked(e *entry) {
	s.dropEntryLocked(e)
	s.unlinking[e.path] = true
}

// staleTemp says whether a temporary file name is one Open may remove: its write
// was last touched StaleTempAge or more ago (file times are the wall clock's).
func staleTemp(name string, modTime time.Time) bool {
	return strings.HasSuffix(name, tempSuffix) && time.Since(modTime) >= StaleTempAge
}
