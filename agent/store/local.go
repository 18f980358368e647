package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// localRecord is the SHA-256 of a local file as it was when hashed: it stays valid
// while the size, modification time and inode do not change.
type localRecord struct {
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	ModTime int64  `json:"modTimeNanos"`
	Inode   uint64 `json:"inode"`
	SHA256  string `json:"sha256"`
}

// allowedLocalPath resolves the symbolic links of path and returns the real path when
// it lies below one of dirs (whose links are resolved too), so that a link inside an
// allowed directory cannot lead out of it. A path that does not exist is checked as
// written, so that the error says it is missing rather than denied. whose names the
// allowance in the error ("allowed for its namespace").
func allowedLocalPath(path string, dirs []string, whose string) (string, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("file %s cannot be checked against the allowed directories: %v", path, err)
		}
		real = filepath.Clean(path)
	}
	resolved := make([]string, 0, 2*len(dirs))
	for _, d := range dirs {
		resolved = append(resolved, d)
		if r, err := filepath.EvalSymlinks(d); err == nil {
			resolved = append(resolved, r)
		}
	}
	if !sourcepolicy.UnderAny(real, resolved) {
		if real != filepath.Clean(path) {
			return "", fmt.Errorf("file %s (a link to %s) is not under a directory %s", path, real, whose)
		}
		return "", fmt.Errorf("file %s is not under a directory %s", path, whose)
	}
	return real, nil
}

// verifyLocal checks a file:// source in place, at path (its resolved LocalPath): a
// regular file starting with the GGUF magic, and with the wanted SHA-256 when given.
// The hash is remembered, so that a restarted agent does not read a multi-gigabyte
// file again.
func (s *Store) verifyLocal(ctx context.Context, src modelsource.Source, path, want string, report func(int64, int64)) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return "", 0, &LocalFileError{Path: path, Reason: "does not exist", Err: err}
		case errors.Is(err, fs.ErrPermission):
			return "", 0, &LocalFileError{Path: path, Reason: "cannot be read by the agent: permission denied", Err: err}
		}
		return "", 0, &LocalFileError{Path: path, Reason: "cannot be opened: " + err.Error(), Err: err}
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return "", 0, &LocalFileError{Path: path, Reason: "cannot be read: " + err.Error(), Err: err}
	}
	if !fi.Mode().IsRegular() {
		return "", 0, &LocalFileError{Path: path, Reason: fmt.Sprintf("is not a regular file (%s)", fi.Mode().Type())}
	}
	magic := make([]byte, len(ggufMagic))
	n, _ := io.ReadFull(f, magic)
	if string(magic[:n]) != ggufMagic {
		return "", 0, &FormatError{Location: path}
	}
	size := fi.Size()
	if want == "" {
		return path, size, nil
	}

	rec := localRecord{Path: path, Size: size, ModTime: fi.ModTime().UnixNano(), Inode: inode(fi)}
	recPath := filepath.Join(s.local, hashName(path)+".json")
	var saved localRecord
	if b, err := os.ReadFile(recPath); err == nil && json.Unmarshal(b, &saved) == nil {
		if h := saved.SHA256; h != "" {
			saved.SHA256 = ""
			if saved == rec {
				rec.SHA256 = h
			}
		}
	}
	if rec.SHA256 == "" {
		s.log.V(2).Info("Hashing local model file", "path", path, "bytes", size)
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return "", 0, &LocalFileError{Path: path, Reason: "cannot be read: " + err.Error(), Err: err}
		}
		h := sha256.New()
		pr := &progressReader{r: ctxReader{ctx, f}, total: size, report: report}
		report(0, size)
		if _, err := io.CopyBuffer(h, pr, make([]byte, copyBuffer)); err != nil {
			if ctx.Err() != nil {
				return "", 0, context.Cause(ctx)
			}
			return "", 0, &LocalFileError{Path: path, Reason: "cannot be read: " + err.Error(), Err: err}
		}
		rec.SHA256 = hex.EncodeToString(h.Sum(nil))
		if b, err := json.Marshal(rec); err == nil {
			if err := writeFileAtomic(recPath, b); err != nil {
				s.log.V(2).Info("Cannot remember the hash of a local model file", "path", path, "err", err.Error())
			}
		}
	}
	if rec.SHA256 != want {
		return "", 0, &ChecksumError{Source: src.Raw, Expected: want, Got: rec.SHA256, Of: "the file"}
	}
	return path, size, nil
}

func inode(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino) //nolint:unconvert // the field type differs between darwin and linux
	}
	return 0
}

// progressReader reports the bytes read through it.
type progressReader struct {
	r      io.Reader
	done   int64
	total  int64
	report func(int64, int64)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.done += int64(n)
		p.report(p.done, p.total)
	}
	return n, err
}

// LocalFileDirs are the directories of Options.LocalFileDirs as the Mac's owner gives
// them (the agent's --allow-file-dir), cleaned; each must be absolute. nil for none.
func LocalFileDirs(dirs []string) ([]string, error) {
	var out []string
	for _, d := range dirs {
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("%q: want an absolute directory", d)
		}
		out = append(out, filepath.Clean(d))
	}
	return out, nil
}
