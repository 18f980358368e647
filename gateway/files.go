package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/gateway/fairqueue"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

// DefaultFilePoll is how often the API keys and fleet token files are checked for
// changes. A Secret mounted as a volume changes by an atomic symlink swap, which a
// stat of the path notices.
const DefaultFilePoll = time.Second

// watchedFile holds the parsed content of a file and re-reads it when its size,
// modification time or inode changes.
type watchedFile[T any] struct {
	path  string
	parse func([]byte) (T, error)
	val   atomic.Pointer[T]
	stamp fileStamp
}

type fileStamp struct {
	size  int64
	mtime time.Time
	ino   uint64
}

func stampOf(fi os.FileInfo) fileStamp {
	s := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := sysIno(fi); ok {
		s.ino = st
	}
	return s
}

// open reads the file at path into f once, with parse; an unreadable file is an
// error at start.
func (f *watchedFile[T]) open(path string, parse func([]byte) (T, error)) error {
	f.path, f.parse = path, parse
	_, err := f.reload()
	return err
}

func (f *watchedFile[T]) get() *T { return f.val.Load() }

// reload re-reads the file if it changed; it reports whether it did.
func (f *watchedFile[T]) reload() (bool, error) {
	fi, err := os.Stat(f.path)
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", f.path, err)
	}
	st := stampOf(fi)
	if f.val.Load() != nil && st == f.stamp {
		return false, nil
	}
	data, err := os.ReadFile(f.path)
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", f.path, err)
	}
	v, err := f.parse(data)
	if err != nil {
		return false, fmt.Errorf("parsing %s: %w", f.path, err)
	}
	f.val.Store(&v)
	f.stamp = st
	return true, nil
}

// watch re-reads the file every interval until ctx ends. A file that disappears or
// fails to parse keeps its last good content (a Secret update is never half-applied).
func (f *watchedFile[T]) watch(ctx context.Context, interval time.Duration, log logr.Logger, what string) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			changed, err := f.reload()
			if err != nil {
				log.Error(err, "Keeping the previous content", "file", what)
			} else if changed {
				log.Info("Reloaded", "file", what, "path", f.path)
			}
		}
	}
}

// keySet is the accepted client API keys with their attributes, by SHA-256 so that a
// lookup's timing says nothing about a key's bytes.
type keySet map[[32]byte]keyAttrs

// keyAttrs are what a keys file line says of its key besides the key.
type keyAttrs struct {
	// priority is the highest priority the key's requests get (see HeaderPriority).
	priority fairqueue.Priority
}

// parseKeys reads one key per line, optionally followed by attributes separated by
// spaces: "priority=batch" keeps the key's requests in the batch class. Blank lines
// and lines starting with # are skipped; an unknown attribute is an error naming its
// line (a key is never logged).
func parseKeys(data []byte) (keySet, error) {
	ks := keySet{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		var attrs keyAttrs
		for _, f := range fields[1:] {
			name, value, _ := strings.Cut(f, "=")
			switch name {
			case "priority":
				p, err := fairqueue.ParsePriority(value)
				if err != nil {
					return nil, fmt.Errorf("line %d: priority=: %w", n, err)
				}
				attrs.priority = p
			default:
				return nil, fmt.Errorf("line %d: unknown attribute %q after the key (known: priority=interactive|batch)", n, name)
			}
		}
		ks[sha256.Sum256([]byte(fields[0]))] = attrs
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return ks, nil
}

// parseToken reads the fleet token: the file's content without surrounding space.
func parseToken(data []byte) (string, error) {
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", fmt.Errorf("the fleet token file is empty")
	}
	if strings.ContainsAny(tok, "\r\n") {
		return "", fmt.Errorf("the fleet token spans several lines")
	}
	return tok, nil
}

// KeysFile is a file of client API keys, one per line with optional attributes
// (blank lines and # comments skipped; see parseKeys), re-read by Watch when it
// changes. An empty file accepts no key.
type KeysFile struct{ f watchedFile[keySet] }

// LoadKeysFile reads the keys file; it must exist and be readable.
func LoadKeysFile(path string) (*KeysFile, error) {
	k := &KeysFile{}
	if err := k.f.open(path, parseKeys); err != nil {
		return nil, err
	}
	return k, nil
}

// Identify says whether key is one of the file's keys, which are admin keys, and
// gives its priority= attribute (interactive by default) as the highest its requests
// get.
func (k *KeysFile) Identify(key string) (tenancy.Identity, bool) {
	a, ok := (*k.f.get())[sha256.Sum256([]byte(key))]
	return tenancy.Identity{Admin: true, Priority: a.priority}, ok
}

// Watch re-reads the file every interval until ctx ends.
func (k *KeysFile) Watch(ctx context.Context, interval time.Duration, log logr.Logger) {
	k.f.watch(ctx, interval, log, "api keys")
}

// TokenFile is the fleet token file, re-read by Watch when it changes (a rotated
// Secret).
type TokenFile struct{ f watchedFile[string] }

// LoadTokenFile reads the token file; it must hold a non-empty single-line token.
func LoadTokenFile(path string) (*TokenFile, error) {
	t := &TokenFile{}
	if err := t.f.open(path, parseToken); err != nil {
		return nil, err
	}
	return t, nil
}

// Token is the current token.
func (t *TokenFile) Token() string { return *t.f.get() }

// Watch re-reads the file every interval until ctx ends.
func (t *TokenFile) Watch(ctx context.Context, interval time.Duration, log logr.Logger) {
	t.f.watch(ctx, interval, log, "fleet token")
}
