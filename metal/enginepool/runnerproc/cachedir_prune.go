package runnerproc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// PromptCachePruneOptions say which prompt cache directories PrunePromptCacheDirs
// keeps.
type PromptCachePruneOptions struct {
	// Now is the current time, from the caller's clock.
	Now time.Time
	// Retention: a directory whose newest entry is older than this may go. It must be
	// positive.
	Retention time.Duration
	// KeepModels are model files still in use (registered in the pool, bound to this
	// node): every directory of theirs (<namespace>_<id>, ~N), whatever the
	// namespace, is kept whatever its age.
	KeepModels []string
}

// PromptCachePruneReport is what PrunePromptCacheDirs removed.
type PromptCachePruneReport struct {
	// Removed are the directories removed.
	Removed []string
	// FreedBytes is the size of the regular files they held.
	FreedBytes int64
}

// PrunePromptCacheDirs removes the SSD directories under ProcessConfig.PromptCacheDir
// that no runner of this factory holds, that no recorded runner (one an earlier agent
// left, adopted or not yet) was started with, that belong to none of
// opts.KeepModels, and whose newest file or directory is older than opts.Retention.
//
// Only real directories directly below PromptCacheDir named as claimCacheDir names
// them are candidates: symbolic links, other files and other names are left alone.
// Symbolic links inside a candidate are not followed, neither for its age nor its
// size, and removing the candidate removes the links, not their targets. A directory
// being removed is held as if a runner had it, so a runner starting meanwhile gets
// another one. The prompt cache directory must not be shared with another agent.
func (f *ProcessFactory) PrunePromptCacheDirs(ctx context.Context, opts PromptCachePruneOptions) (PromptCachePruneReport, error) {
	var rep PromptCachePruneReport
	root := f.cfg.PromptCacheDir
	if root == "" {
		return rep, nil
	}
	if opts.Retention <= 0 {
		return rep, errors.New("pruning the prompt cache directories needs a positive retention")
	}
	keep := map[string]bool{}
	for _, p := range opts.KeepModels {
		keep[PromptCacheModelID(p)] = true
	}
	recorded := map[string]bool{}
	if f.cfg.StateDir != "" {
		recs, err := f.readRecords()
		if err != nil {
			// Without the records, what is in use cannot be told.
			return rep, fmt.Errorf("pruning the prompt cache directories: %w", err)
		}
		for _, rec := range recs {
			if rec.CacheDir != "" {
				recorded[filepath.Clean(rec.CacheDir)] = true
			}
		}
	}
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("pruning the prompt cache directories: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return rep, errors.Join(append(errs, err)...)
		}
		id, legacy, ok := cacheDirID(e.Name())
		if !ok || (keep[id] && !legacy) || e.Type() != fs.ModeDir {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if recorded[dir] || !f.holdCacheDirForPrune(dir) {
			continue
		}
		freed, removed, err := removeIfIdle(dir, opts.Now, opts.Retention)
		f.releasePruneHold(dir)
		if err != nil {
			errs = append(errs, err)
		}
		if removed {
			rep.Removed = append(rep.Removed, dir)
			rep.FreedBytes += freed
		}
	}
	return rep, errors.Join(errs...)
}

// holdCacheDirForPrune marks dir as being removed unless a runner has it: a runner
// starting meanwhile gets another directory (claimCacheDir).
func (f *ProcessFactory) holdCacheDirForPrune(dir string) bool {
	f.claimMu.Lock()
	defer f.claimMu.Unlock()
	if f.cacheDirs[dir] > 0 || f.pruning[dir] {
		return false
	}
	f.pruning[dir] = true
	return true
}

// releasePruneHold ends holdCacheDirForPrune's hold.
func (f *ProcessFactory) releasePruneHold(dir string) {
	f.claimMu.Lock()
	defer f.claimMu.Unlock()
	delete(f.pruning, dir)
}

// cacheDirID returns the model id of a directory name claimCacheDir gives:
// <namespace>_<id> or <namespace>_<id>~N, where <id> is a PromptCacheModelID. legacy
// is a name without a namespace (<id>, <id>~N), as agents named them before: never
// reused, so never kept for a model in use.
func cacheDirID(name string) (id string, legacy, ok bool) {
	if ns, rest, found := strings.Cut(name, "_"); found && isNamespace(ns) {
		if id, ok := modelCacheDirID(rest); ok {
			return id, false, true
		}
	}
	id, ok = modelCacheDirID(name)
	return id, true, ok
}

// isNamespace reports whether s is a Kubernetes namespace name (a DNS label).
func isNamespace(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range s {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// modelCacheDirID returns the model id of <id> or <id>~N.
func modelCacheDirID(name string) (string, bool) {
	id := name
	if i := strings.LastIndexByte(name, '~'); i >= 0 {
		n, err := strconv.Atoi(name[i+1:])
		if err != nil || n < 2 || strconv.Itoa(n) != name[i+1:] {
			return "", false
		}
		id = name[:i]
	}
	if h, ok := strings.CutPrefix(id, "sha256-"); ok && len(h) == 64 && isLowerHex(h) {
		return id, true
	}
	// <sanitized file name>-<12 hex digits of the path's hash>
	i := strings.LastIndexByte(id, '-')
	if i <= 0 || len(id)-i-1 != 12 || !isLowerHex(id[i+1:]) || i > maxCacheIDName+len("model") || id[0] == '.' {
		return "", false
	}
	for _, r := range id[:i] {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
		default:
			return "", false
		}
	}
	return id, true
}

// removeIfIdle removes dir when nothing in it (itself included) was modified within
// retention before now. It returns the bytes of the regular files it held.
func removeIfIdle(dir string, now time.Time, retention time.Duration) (int64, bool, error) {
	var newest time.Time
	var size int64
	// WalkDir does not follow symbolic links: a link's own times count, not its
	// target's.
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if info.ModTime().After(newest) {
			newest = info.ModTime()
		}
		if info.Mode().IsRegular() {
			size += info.Size()
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("reading the prompt cache directory %s: %w", dir, err)
	}
	if now.Sub(newest) <= retention {
		return 0, false, nil
	}
	// RemoveAll unlinks symbolic links without following them.
	if err := os.RemoveAll(dir); err != nil {
		return 0, false, fmt.Errorf("removing the prompt cache directory %s: %w", dir, err)
	}
	return size, true, nil
}
