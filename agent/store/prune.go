package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/macfleet/macfleet/internal/modelsource"
)

// A file's use time is the later of its own modification time (when it was
// downloaded) and that of its marker used/sha256-<hex>, which every successful Fetch
// and every Prune that keeps it refreshes. The file itself is never touched: its
// modification time is part of a runner's adoption fingerprint (enginepool), so changing
// it would make a restarted agent reload every model instead of adopting its runner.
//
// Fetch refreshes the marker under a shared flock on the file, and Prune removes a
// file under an exclusive one after reading its use time again: either Prune sees the
// new use, or the file is gone before Fetch looks and Fetch downloads it again. Two
// agents sharing the directory therefore never delete a file the other just returned.

// errPruned is a stored file that a Prune removed while Fetch was returning it.
var errPruned = errors.New("the stored file was pruned")

// maxPrunedRetries bounds how often one Fetch starts over because a concurrent Prune
// removed the file it found.
const maxPrunedRetries = 3

// Model names a model file as Fetch does: its source and optional sha256.
type Model struct {
	Source string
	SHA256 string
}

// PruneOptions say what Prune keeps.
type PruneOptions struct {
	// Keep are the models in use: their files are kept whatever their age (and their
	// use time refreshed, so that another agent sharing the directory keeps them too),
	// and so are their partial downloads.
	Keep []Model
	// KeepPaths are files in use by path (what Fetch returned, e.g. the models an
	// engine has loaded): kept and refreshed like Keep.
	KeepPaths []string
	// Retention is how long an unused file, or an idle partial download, is kept. It
	// must be positive.
	Retention time.Duration
}

// Kinds of what Prune removes.
const (
	KindBlob    = "blob"    // a complete model file
	KindPartial = "partial" // an abandoned partial download and its metadata
	KindRef     = "ref"     // a source's record of a file that is gone
	KindLocal   = "local"   // the remembered hash of a local file that is gone
	KindMarker  = "marker"  // the use time of a file that is gone
	KindTemp    = "temp"    // what an interrupted atomic write left
)

// Removed is one file Prune removed.
type Removed struct {
	Kind  string
	Path  string
	Bytes int64
}

// PruneReport is what Prune removed.
type PruneReport struct {
	Removed    []Removed
	FreedBytes int64
}

func (r *PruneReport) add(kind, path string, bytes int64) {
	r.Removed = append(r.Removed, Removed{Kind: kind, Path: path, Bytes: bytes})
	r.FreedBytes += bytes
}

// Prune removes from the store:
//   - complete files that are not in use (opts.Keep, opts.KeepPaths) and were not
//     used (fetched, or kept by a Prune of any agent sharing the directory) for longer
//     than opts.Retention;
//   - partial downloads of files not in use that nothing wrote for longer than
//     opts.Retention and that no download holds (locked by this or another process);
//   - records in refs/ and local/ that point to nothing, use markers of files that
//     are gone, directories of part names (parts/) that name a file that is gone
//     and were not written for opts.Retention, and stale temporary files.
//
// It never removes a file that a concurrent Fetch is returning (see errPruned). It
// goes on after a file it cannot remove and returns those errors joined, with the
// report of what it did remove.
func (s *Store) Prune(ctx context.Context, opts PruneOptions) (PruneReport, error) {
	var rep PruneReport
	if opts.Retention <= 0 {
		return rep, errors.New("model store: pruning needs a positive retention")
	}
	s.pruneMu.Lock()
	defer s.pruneMu.Unlock()
	keepBlobs, keepPartials := s.keepSet(opts)
	var errs []error
	fail := func(err error) {
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}

	entries, err := os.ReadDir(s.blobs)
	if err != nil {
		return rep, fmt.Errorf("model store: %w", err)
	}
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return rep, errors.Join(append(errs, err)...)
		}
		name := e.Name()
		path := filepath.Join(s.blobs, name)
		switch {
		case isBlobName(name):
			if keepBlobs[name] {
				if err := s.markUsed(path); err != nil && !errors.Is(err, errPruned) {
					fail(err)
				}
				continue
			}
			fail(s.pruneBlob(path, opts.Retention, &rep))
		case strings.HasSuffix(name, ".partial"):
			if !keepPartials[name] {
				fail(s.prunePartial(path, opts.Retention, &rep))
			}
		case strings.HasSuffix(name, ".partial.json"):
			// Metadata without its partial file: what a removal cut short left.
			if _, err := os.Lstat(strings.TrimSuffix(path, ".json")); errors.Is(err, fs.ErrNotExist) {
				fail(s.removeIfOlder(path, KindPartial, opts.Retention, &rep))
			}
		}
	}
	fail(s.pruneParts(opts.Retention, &rep))
	fail(s.pruneRecords(s.refs, KindRef, opts.Retention, &rep, s.refPointsToNothing))
	fail(s.pruneRecords(s.local, KindLocal, opts.Retention, &rep, localPointsToNothing))
	fail(s.pruneMarkers(&rep))
	for _, d := range []string{s.blobs, s.refs, s.local} {
		fail(s.pruneTemp(d, &rep))
	}

	if len(rep.Removed) > 0 {
		counts := map[string]int{}
		for _, r := range rep.Removed {
			counts[r.Kind]++
		}
		s.log.Info("Pruned the model store", "dir", s.dir, "removed", len(rep.Removed), "byKind", counts,
			"freedBytes", rep.FreedBytes, "retention", opts.Retention)
	}
	return rep, errors.Join(errs...)
}

// keepSet names the files and partial files of the models in use.
func (s *Store) keepSet(opts PruneOptions) (blobs, partials map[string]bool) {
	blobs, partials = map[string]bool{}, map[string]bool{}
	for _, m := range opts.Keep {
		want, err := normalizeDigest(m.Source, m.SHA256)
		if err != nil {
			continue
		}
		src, err := modelsource.Parse(m.Source)
		if err != nil || src.Scheme == modelsource.File {
			continue
		}
		if want != "" {
			blobs["sha256-"+want] = true
		}
		// Each part of a model stored in parts is a source of its own.
		for _, p := range src.PartSources() {
			if d := s.readRef(p); d != "" {
				blobs["sha256-"+d] = true
			}
			// Partial files are named by their source (older ones, sha256-<hex>.partial,
			// are never resumed and go once idle for the retention).
			partials["src-"+hashName(p.String())+".partial"] = true
		}
	}
	for _, p := range opts.KeepPaths {
		abs, err := filepath.Abs(p)
		if err == nil && filepath.Dir(abs) == s.blobs {
			blobs[filepath.Base(abs)] = true
		}
		if err == nil {
			s.keepParts(abs, blobs)
		}
	}
	return blobs, partials
}

// isBlobName says whether name is that of a complete file: sha256-<64 hex digits>.
func isBlobName(name string) bool {
	h, ok := strings.CutPrefix(name, "sha256-")
	if !ok {
		return false
	}
	_, err := normalizeDigest("", h)
	return err == nil && h == strings.ToLower(h)
}

func (s *Store) markerPath(blob string) string {
	return filepath.Join(s.used, filepath.Base(blob))
}

// markUsed records that the complete file at path was used now. It returns errPruned
// when the file is gone, removed by a Prune of this or another process.
func (s *Store) markUsed(path string) error {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return errPruned
		}
		return fmt.Errorf("model store: %w", err)
	}
	defer func() { _ = f.Close() }()
	// A Prune holds its exclusive lock only to read the use time again and unlink.
	if err := flock(f, unix.LOCK_SH); err != nil {
		return fmt.Errorf("locking %s: %w", path, err)
	}
	if !sameFile(f, path) {
		return errPruned
	}
	now := s.clock.Now()
	marker := s.markerPath(path)
	err = os.Chtimes(marker, now, now)
	if errors.Is(err, fs.ErrNotExist) {
		var m *os.File
		if m, err = os.OpenFile(marker, os.O_WRONLY|os.O_CREATE, 0o644); err == nil {
			_ = m.Close()
			err = os.Chtimes(marker, now, now)
		}
	}
	if err != nil {
		return fmt.Errorf("recording the use of %s: %w", path, err)
	}
	return nil
}

// flock takes a lock on f, waiting for it.
func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// tryLock takes an exclusive lock on f if no one holds one.
func tryLock(f *os.File) (bool, error) {
	err := flock(f, unix.LOCK_EX|unix.LOCK_NB)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EWOULDBLOCK):
		return false, nil
	}
	return false, fmt.Errorf("locking %s: %w", f.Name(), err)
}

// lastUse is when the complete file at path was last used.
func (s *Store) lastUse(fi fs.FileInfo, path string) time.Time {
	t := fi.ModTime()
	if m, err := os.Stat(s.markerPath(path)); err == nil && m.ModTime().After(t) {
		t = m.ModTime()
	}
	return t
}

// pruneBlob removes the complete file at path if it was not used for longer than
// retention.
func (s *Store) pruneBlob(path string, retention time.Duration, rep *PruneReport) error {
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() || s.clock.Since(s.lastUse(fi, path)) <= retention {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	if ok, err := tryLock(f); !ok {
		return err // a Fetch is recording its use
	}
	// What was seen before the lock may have changed: a use recorded meanwhile, or
	// another agent's Prune that removed the file.
	if !sameFile(f, path) {
		return nil
	}
	if fi, err = f.Stat(); err != nil {
		return err
	}
	last := s.lastUse(fi, path)
	if s.clock.Since(last) <= retention {
		return nil
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("model store: %w", err)
	}
	_ = os.Remove(s.markerPath(path))
	s.log.Info("Removed an unused model file", "path", path, "bytes", fi.Size(), "lastUse", last)
	rep.add(KindBlob, path, fi.Size())
	return nil
}

// prunePartial removes the partial file at path and its metadata if nothing wrote
// them for longer than retention and no download holds the file's lock.
func (s *Store) prunePartial(path string, retention time.Duration, rep *PruneReport) error {
	written := func() (time.Time, int64, bool) {
		fi, err := os.Lstat(path)
		if err != nil || !fi.Mode().IsRegular() {
			return time.Time{}, 0, false
		}
		t, n := fi.ModTime(), fi.Size()
		if m, err := os.Lstat(path + ".json"); err == nil {
			n += m.Size()
			if m.ModTime().After(t) {
				t = m.ModTime()
			}
		}
		return t, n, true
	}
	if t, _, ok := written(); !ok || s.clock.Since(t) <= retention {
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	if ok, err := tryLock(f); !ok {
		return err // a download writes it, or waits to
	}
	if !sameFile(f, path) {
		return nil
	}
	t, n, ok := written()
	if !ok || s.clock.Since(t) <= retention {
		return nil
	}
	// Removed before the lock is released, as a download that gives up does: a
	// Fetch waiting for the lock then finds the file gone and starts a new one.
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("model store: %w", err)
	}
	_ = os.Remove(path + ".json")
	s.log.V(1).Info("Removed an abandoned partial download", "path", path, "bytes", n, "lastWrite", t)
	rep.add(KindPartial, path, n)
	return nil
}

// removeIfOlder removes the file at path if it was not modified for longer than age.
func (s *Store) removeIfOlder(path, kind string, age time.Duration, rep *PruneReport) error {
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() || s.clock.Since(fi.ModTime()) <= age {
		return nil
	}
	if err := os.Remove(path); err != nil {
		return err
	}
	rep.add(kind, path, fi.Size())
	return nil
}

// pruneRecords removes the records (*.json) in dir that point to nothing, and those
// that cannot be read and were not written for longer than retention.
func (s *Store) pruneRecords(dir, kind string, retention time.Duration, rep *PruneReport,
	dangling func(b []byte) (bad, gone bool)) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("model store: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(path)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		bad, gone := dangling(b)
		if bad && s.clock.Since(fi.ModTime()) <= retention {
			continue
		}
		if !bad && !gone {
			continue
		}
		// Records are replaced by rename: one written since it was read (a download
		// that just completed) is another file, and stays.
		if cur, err := os.Lstat(path); err != nil || !os.SameFile(fi, cur) {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		rep.add(kind, path, fi.Size())
	}
	return errors.Join(errs...)
}

// refPointsToNothing: the file a source gave is no longer in the store.
func (s *Store) refPointsToNothing(b []byte) (bad, gone bool) {
	var r ref
	if json.Unmarshal(b, &r) != nil || r.Source == "" {
		return true, false
	}
	if _, err := normalizeDigest("", r.Digest); err != nil {
		return true, false
	}
	_, err := os.Lstat(s.blobPath(r.Digest))
	return false, errors.Is(err, fs.ErrNotExist)
}

// localPointsToNothing: the local file whose hash was remembered is gone.
func localPointsToNothing(b []byte) (bad, gone bool) {
	var r localRecord
	if json.Unmarshal(b, &r) != nil || r.Path == "" {
		return true, false
	}
	_, err := os.Lstat(r.Path)
	return false, errors.Is(err, fs.ErrNotExist)
}

// pruneMarkers removes the use markers of files that are gone.
func (s *Store) pruneMarkers(rep *PruneReport) error {
	entries, err := os.ReadDir(s.used)
	if err != nil {
		return fmt.Errorf("model store: %w", err)
	}
	for _, e := range entries {
		if !isBlobName(e.Name()) {
			continue
		}
		if _, err := os.Lstat(filepath.Join(s.blobs, e.Name())); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		// A marker is only created for a file that exists: at worst a file completed
		// since loses its marker and counts as used when it was downloaded.
		p := filepath.Join(s.used, e.Name())
		if err := os.Remove(p); err == nil {
			rep.add(KindMarker, p, 0)
		}
	}
	return nil
}

// pruneTemp removes what interrupted atomic writes left in dir (see removeTemp).
func (s *Store) pruneTemp(dir string, rep *PruneReport) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("model store: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), tempSuffix) {
			_ = s.removeIfOlder(filepath.Join(dir, e.Name()), KindTemp, staleTemp, rep)
		}
	}
	return nil
}
