package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/macfleet/macfleet/internal/modelsource"
)

// A model stored in several files (NAME-00001-of-0000N.gguf) is fetched part by part,
// each part a source of one file: its own download, resumed from its own partial
// file, verified and recorded as any file is. The runner is given the first part's
// path and looks the others up beside it by name, so the store names them:
//
//	parts/<hash of the first part's source>/NAME-0000i-of-0000N.gguf → ../../blobs/sha256-<hex>
//
// A link is only a name: Prune treats its blob like any other (kept while the model is
// in use, by source or by the first part's path) and removes a directory whose links
// lead to a pruned file; the next Fetch downloads that part again and links it anew.

// KindParts is a directory of a model's part names that Prune removed.
const KindParts = "parts"

// fetchParts fetches every part of the model r.src names (its first part) and
// returns the first part's path, the others beside it under their own names.
func (s *Store) fetchParts(ctx context.Context, r fetchReq) (string, error) {
	parts := r.src.PartSources()
	prog := newPartsProgress(len(parts), r.progress)
	paths := make([]string, len(parts))
	for i, p := range parts {
		p.Parts = 0
		need, err := s.partNeeded(ctx, r, i, p)
		if err != nil {
			return "", err
		}
		if !need {
			prog.skip(i)
			continue
		}
		pr := r
		pr.src, pr.progress = p, prog.of(i)
		if p.Scheme == modelsource.File {
			paths[i], err = s.fetchLocal(ctx, pr)
		} else {
			paths[i], err = s.fetchFile(ctx, pr)
		}
		if err != nil {
			return "", fmt.Errorf("part %d of the %d files of %s: %w", i+1, len(parts), r.src.Raw, err)
		}
	}
	if r.src.Scheme == modelsource.File {
		return besideFirst(parts, paths)
	}
	return s.linkParts(r.src, parts, paths)
}

// besideFirst returns the first part's path when every resolved part is where the
// runner looks for it: under its own name in the first part's directory.
func besideFirst(parts []modelsource.Source, paths []string) (string, error) {
	dir := filepath.Dir(paths[0])
	for i, p := range paths {
		if want := filepath.Join(dir, parts[i].FileName()); p != want {
			return "", &LocalFileError{Path: parts[i].LocalPath, Reason: fmt.Sprintf(
				"is %s once its links are resolved, not %s: the runner looks the parts of a model up beside the first, by name", p, want)}
		}
	}
	return paths[0], nil
}

// partsDir is the directory of the part names of the model whose first part src is.
func (s *Store) partsDir(src modelsource.Source) string {
	return filepath.Join(s.parts, hashName(src.String()))
}

// linkParts names each part's blob by the part's name in the model's directory under
// parts/ (a part without a blob, "", is not named), and returns the first part's name.
func (s *Store) linkParts(src modelsource.Source, parts []modelsource.Source, blobs []string) (string, error) {
	dir := s.partsDir(src)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("model store: %w", err)
	}
	for i, p := range parts {
		if blobs[i] == "" {
			continue
		}
		link := filepath.Join(dir, p.FileName())
		target, err := filepath.Rel(dir, blobs[i])
		if err != nil {
			return "", fmt.Errorf("model store: %w", err)
		}
		if t, err := os.Readlink(link); err == nil && t == target {
			continue
		}
		tmp := link + "." + strconv.FormatUint(rand.Uint64(), 36) + tempSuffix
		if err := os.Symlink(target, tmp); err != nil {
			return "", fmt.Errorf("model store: naming part %d of %s: %w", i+1, src.Raw, err)
		}
		if err := os.Rename(tmp, link); err != nil {
			_ = os.Remove(tmp)
			return "", fmt.Errorf("model store: naming part %d of %s: %w", i+1, src.Raw, err)
		}
	}
	syncDir(dir)
	return filepath.Join(dir, parts[0].FileName()), nil
}

// partsProgress adds the parts' progress up into one report: the bytes of every part
// so far, and the total once every part's is known (-1 until then).
type partsProgress struct {
	done, total []int64
	report      func(done, total int64)
}

func newPartsProgress(n int, report func(done, total int64)) *partsProgress {
	p := &partsProgress{done: make([]int64, n), total: make([]int64, n), report: report}
	for i := range p.total {
		p.total[i] = -1
	}
	return p
}

// skip counts part i, which is not fetched, as done with no bytes.
func (p *partsProgress) skip(i int) { p.done[i], p.total[i] = 0, 0 }

// of is the progress callback of part i (nil when nobody watches). The parts are
// fetched one after another, so the callbacks never run at once.
func (p *partsProgress) of(i int) func(done, total int64) {
	if p.report == nil {
		return nil
	}
	return func(done, total int64) {
		p.done[i], p.total[i] = done, total
		var d, t int64
		for j := range p.done {
			d += p.done[j]
			if t >= 0 && p.total[j] >= 0 {
				t += p.total[j]
			} else {
				t = -1
			}
		}
		p.report(d, t)
	}
}

// keepParts adds to blobs the files a kept path under parts/ names: the blobs of its
// directory's links.
func (s *Store) keepParts(path string, blobs map[string]bool) {
	if filepath.Dir(filepath.Dir(path)) != s.parts {
		return
	}
	dir := filepath.Dir(path)
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if t, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && filepath.Dir(filepath.Join(dir, t)) == s.blobs {
			blobs[filepath.Base(t)] = true
		}
	}
}

// pruneParts removes the directories under parts/ that name a file no longer in the
// store and that no Fetch wrote for retention (the next Fetch of the model links its
// parts again), and stale temporary links.
func (s *Store) pruneParts(retention time.Duration, rep *PruneReport) error {
	entries, err := os.ReadDir(s.parts)
	if err != nil {
		return fmt.Errorf("model store: %w", err)
	}
	var errs []error
	for _, e := range entries {
		dir := filepath.Join(s.parts, e.Name())
		if !e.IsDir() {
			continue
		}
		errs = append(errs, s.pruneTemp(dir, rep))
		fi, err := os.Stat(dir)
		if err != nil || s.clock.Since(fi.ModTime()) <= retention {
			continue
		}
		links, err := os.ReadDir(dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, l := range links {
			if _, err := os.Stat(filepath.Join(dir, l.Name())); errors.Is(err, fs.ErrNotExist) {
				if err := os.RemoveAll(dir); err != nil {
					errs = append(errs, err)
				} else {
					rep.add(KindParts, dir, 0)
				}
				break
			}
		}
	}
	return errors.Join(errs...)
}
