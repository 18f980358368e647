package store

import (
	"context"
	"crypto/sha256"
	"encoding"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// ggufMagic starts every GGUF file.
const ggufMagic = "GGUF"

// copyBuffer is the size of the reads from a response body.
const copyBuffer = 1 << 20

// maxRestarts bounds how often one Fetch starts a download over because the server
// answered a resume with something unusable.
const maxRestarts = 2

// errStalled is the cause of a request cancelled by the stall timer.
var errStalled = errors.New("stalled")

// download resolves src, downloads it into the store and verifies it. It returns the
// verified file's path and size.
func (s *Store) download(ctx context.Context, src modelsource.Source, want string, report func(int64, int64)) (string, int64, error) {
	loc, err := s.resolve(ctx, src)
	if err != nil {
		return "", 0, err
	}
	digest := want
	if loc.Digest != "" {
		algo, h, _ := strings.Cut(loc.Digest, ":")
		h = strings.ToLower(h)
		if _, err := normalizeDigest("", h); algo != "sha256" || err != nil {
			return "", 0, &DigestError{Source: src.Raw, Digest: loc.Digest, Reason: "of the registry's model layer is not a SHA-256"}
		}
		if want != "" && h != want {
			return "", 0, &ChecksumError{Source: src.Raw, Expected: want, Got: h, Of: "the registry manifest"}
		}
		digest = h
		// The registry's word is not enough to hand out a file another source gave.
		if p, size, ok := s.complete(digest); ok && s.verifiedFrom(src, digest) {
			return p, size, nil
		}
	}
	// A partial file per source: bytes from one source are never completed from
	// another.
	name := "src-" + hashName(src.String())
	done := func() (string, int64, bool) {
		d := digest
		if d == "" {
			d = s.readRef(src)
		}
		if !s.verifiedFrom(src, d) {
			return "", 0, false
		}
		return s.complete(d)
	}
	part, p, size, err := s.openPartial(ctx, name, done)
	if err != nil {
		return "", 0, err
	}
	if part == nil {
		return p, size, nil
	}
	defer part.close()

	for restarts := 0; ; restarts++ {
		restart, err := s.transfer(ctx, part, src, loc, digest, report)
		if err != nil {
			if part.off == 0 {
				// Nothing to resume: leave no trace.
				part.remove()
			}
			return "", 0, err
		}
		if !restart {
			break
		}
		if restarts == maxRestarts {
			return "", 0, fmt.Errorf("downloading %s: the server answered %d range requests with inconsistent ranges", loc.URL, restarts+1)
		}
	}
	p, got, err := s.finish(part, src, loc.URL, digest)
	if err != nil {
		return "", 0, err
	}
	s.writeRef(src, got)
	s.log.V(2).Info("Downloaded model", "source", src.String(), "path", p, "bytes", part.off)
	return p, part.off, nil
}

func (s *Store) resolve(ctx context.Context, src modelsource.Source) (modelsource.Location, error) {
	return s.locator.resolve(ctx, src)
}

// partialMeta is what resuming a download needs, beside the partial file.
type partialMeta struct {
	URL          string `json:"url,omitempty"`
	ETag         string `json:"etag,omitempty"`
	LastModified string `json:"lastModified,omitempty"`
	// Total is the file's size, -1 while unknown.
	Total int64 `json:"total"`
	// HashState is the SHA-256 state after the first HashOffset bytes of the file.
	HashOffset int64  `json:"hashOffset"`
	HashState  []byte `json:"hashState,omitempty"`
}

// partial is an open, locked partial file and the hash of its first off bytes.
type partial struct {
	path, metaPath string
	f              *os.File
	meta           partialMeta
	h              hash.Hash
	off            int64
}

// openPartial opens and locks the partial file called name, waiting while another
// process holds it. done reports a file another process completed meanwhile: then
// openPartial returns its path and no partial.
func (s *Store) openPartial(ctx context.Context, name string, done func() (string, int64, bool)) (*partial, string, int64, error) {
	path := filepath.Join(s.blobs, name+".partial")
	for {
		if p, size, ok := done(); ok {
			return nil, p, size, nil
		}
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, "", 0, fmt.Errorf("model store: %w", err)
		}
		if err := lockFile(ctx, f, s.log); err != nil {
			_ = f.Close()
			return nil, "", 0, err
		}
		if p, size, ok := done(); ok {
			_ = f.Close()
			return nil, p, size, nil
		}
		// The holder we waited for may have renamed or removed the file.
		if !sameFile(f, path) {
			_ = f.Close()
			continue
		}
		part := &partial{path: path, metaPath: path + ".json", f: f}
		if err := part.load(ctx); err != nil {
			_ = f.Close()
			return nil, "", 0, err
		}
		return part, "", 0, nil
	}
}

func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

// load reads the metadata and brings the hash up to the end of the file, reading only
// what the saved hash state does not cover.
func (p *partial) load(ctx context.Context) error {
	fi, err := p.f.Stat()
	if err != nil {
		return fmt.Errorf("model store: %w", err)
	}
	size := fi.Size()
	p.meta = partialMeta{Total: -1}
	if b, err := os.ReadFile(p.metaPath); err == nil {
		if json.Unmarshal(b, &p.meta) != nil {
			p.meta = partialMeta{Total: -1}
		}
	}
	if p.meta.Total >= 0 && size > p.meta.Total {
		return p.reset("")
	}
	p.h = sha256.New()
	from := int64(0)
	if len(p.meta.HashState) > 0 && p.meta.HashOffset > 0 && p.meta.HashOffset <= size {
		if p.h.(encoding.BinaryUnmarshaler).UnmarshalBinary(p.meta.HashState) == nil {
			from = p.meta.HashOffset
		} else {
			p.h = sha256.New()
		}
	}
	if _, err := io.Copy(p.h, ctxReader{ctx, io.NewSectionReader(p.f, from, size-from)}); err != nil {
		return fmt.Errorf("reading %s: %w", p.path, err)
	}
	p.off = size
	if _, err := p.f.Seek(size, io.SeekStart); err != nil {
		return fmt.Errorf("model store: %w", err)
	}
	return nil
}

// reset empties the partial file to download url from the start.
func (p *partial) reset(url string) error {
	if err := p.f.Truncate(0); err != nil {
		return fmt.Errorf("model store: %w", err)
	}
	if _, err := p.f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("model store: %w", err)
	}
	p.h = sha256.New()
	p.off = 0
	p.meta = partialMeta{URL: url, Total: -1}
	return nil
}

// checkpoint makes the partial file durable and saves the hash state matching it, so
// that a resume, even after a restart, does not read the file again.
func (p *partial) checkpoint() error {
	if err := p.f.Sync(); err != nil {
		return err
	}
	state, err := p.h.(encoding.BinaryMarshaler).MarshalBinary()
	if err != nil {
		return err
	}
	p.meta.HashOffset, p.meta.HashState = p.off, state
	return p.saveMeta()
}

func (p *partial) saveMeta() error {
	b, err := json.Marshal(p.meta)
	if err != nil {
		return err
	}
	return writeFileAtomic(p.metaPath, b)
}

// remove deletes the partial file and its metadata (before unlocking them).
func (p *partial) remove() {
	_ = os.Remove(p.path)
	_ = os.Remove(p.metaPath)
}

func (p *partial) close() { _ = p.f.Close() }

// transfer makes one request for the rest of the file and appends the body to the
// partial. restart means the partial was emptied and the request must be made again.
func (s *Store) transfer(ctx context.Context, p *partial, src modelsource.Source, loc modelsource.Location, digest string, report func(int64, int64)) (restart bool, err error) {
	url := loc.URL
	log := s.log.WithValues("source", src.String(), "url", url)
	sameURL := p.meta.URL == url
	validator := p.meta.ETag != "" || p.meta.LastModified != ""
	// Bytes from elsewhere are only appended to when the digest will check them.
	resume := p.off > 0 && (digest != "" || (sameURL && validator))
	if p.off > 0 && !resume {
		log.V(2).Info("Discarding a partial download that cannot be resumed", "bytes", p.off)
	}
	if !resume {
		if err := p.reset(url); err != nil {
			return false, err
		}
	}

	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stall := time.AfterFunc(s.stallTimeout, func() { cancel(errStalled) })
	defer stall.Stop()
	req, err := s.request(rctx, p, src, url, resume, sameURL, log)
	if err != nil {
		return false, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return false, s.transferErr(ctx, rctx, url, err)
	}
	defer func() { _ = resp.Body.Close() }()

	etag, lastMod := resp.Header.Get("ETag"), resp.Header.Get("Last-Modified")
	total, restart, done, err := p.answer(resp, src, url, resume, log)
	if done || err != nil {
		return restart, err
	}
	if total < 0 && loc.Size > 0 {
		total = loc.Size
	}
	if s.maxBytes > 0 && total > s.maxBytes {
		return false, &TooLargeError{URL: url, Size: total, Max: s.maxBytes}
	}
	p.meta.URL, p.meta.Total = url, total
	if etag != "" || lastMod != "" {
		p.meta.ETag, p.meta.LastModified = etag, lastMod
	}
	if err := p.checkpoint(); err != nil {
		return false, fmt.Errorf("model store: %w", err)
	}
	if total > p.off {
		if err := s.checkSpace(uint64(total - p.off)); err != nil {
			return false, err
		}
	}
	return false, s.appendBody(ctx, rctx, p, resp.Body, url, total, stall, report)
}

// request is the GET of the file at url: of the rest of it (from the partial's
// offset, if the version is unchanged when the server can tell) when resuming.
func (s *Store) request(rctx context.Context, p *partial, src modelsource.Source, url string, resume, sameURL bool, log logr.Logger) (*http.Request, error) {
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("downloading %s: %w", src.Raw, err)
	}
	// Asking for identity keeps the transport from decompressing, so that byte offsets
	// are the file's.
	req.Header.Set("Accept-Encoding", "identity")
	if tok := s.hfToken.get(rctx, src); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if !resume {
		log.V(2).Info("Downloading model")
		return req, nil
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-", p.off))
	switch {
	case !sameURL:
	case p.meta.ETag != "" && !strings.HasPrefix(p.meta.ETag, "W/"):
		req.Header.Set("If-Range", p.meta.ETag)
	case p.meta.LastModified != "":
		req.Header.Set("If-Range", p.meta.LastModified)
	}
	log.V(2).Info("Resuming download", "offset", p.off)
	return req, nil
}

// answer reads the status of the server's answer: the rest of the file (the file's
// total size, -1 if unknown), the whole file (the partial emptied to take it), or
// nothing more to take (done; restart if the partial was emptied and the request
// must be made again).
func (p *partial) answer(resp *http.Response, src modelsource.Source, url string, resume bool, log logr.Logger) (total int64, restart, done bool, err error) {
	switch resp.StatusCode {
	case http.StatusPartialContent:
		start, size, ok := parseContentRange(resp.Header.Get("Content-Range"))
		etag := resp.Header.Get("ETag")
		changed := (p.meta.ETag != "" && etag != "" && etag != p.meta.ETag) ||
			(p.meta.Total >= 0 && size >= 0 && size != p.meta.Total)
		if !resume || !ok || start != p.off || changed {
			log.V(2).Info("Server answered the resume with another range or version; starting over", "contentRange", resp.Header.Get("Content-Range"))
			return 0, true, true, p.reset(url)
		}
		return size, false, false, nil
	case http.StatusOK:
		if p.off > 0 {
			log.V(2).Info("Server sent the whole file; starting over", "discarded", p.off)
		}
		if err := p.reset(url); err != nil {
			return 0, false, true, err
		}
		return resp.ContentLength, false, false, nil
	case http.StatusRequestedRangeNotSatisfiable:
		if _, size, ok := parseContentRange(resp.Header.Get("Content-Range")); ok && resume && size == p.off {
			// The partial already holds the whole file.
			return 0, false, true, nil
		}
		return 0, true, true, p.reset(url)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	return 0, false, true, fmt.Errorf("downloading %s: %w", src.Raw, &modelsource.StatusError{URL: url, StatusCode: resp.StatusCode, Status: resp.Status})
}

// appendBody appends body to the partial, hashing it as it goes and reporting the
// progress towards total; stall is pushed back by every read that brings bytes.
func (s *Store) appendBody(ctx, rctx context.Context, p *partial, body io.Reader, url string, total int64, stall *time.Timer, report func(int64, int64)) error {
	buf := make([]byte, copyBuffer)
	report(p.off, total)
	for {
		n, rerr := body.Read(buf)
		if s.maxBytes > 0 && p.off+int64(n) > s.maxBytes {
			// A server that did not say the size, or said less than it sends.
			_ = p.reset(url)
			_ = p.saveMeta()
			return &TooLargeError{URL: url, Size: -1, Max: s.maxBytes}
		}
		if n > 0 {
			stall.Reset(s.stallTimeout)
			if _, werr := p.f.Write(buf[:n]); werr != nil {
				// The file may hold part of buf: reload from it next time.
				p.meta.HashState = nil
				_ = p.saveMeta()
				return fmt.Errorf("writing %s: %w", p.path, werr)
			}
			p.h.Write(buf[:n])
			p.off += int64(n)
			report(p.off, total)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			_ = p.checkpoint()
			return s.transferErr(ctx, rctx, url, rerr)
		}
	}
	if total >= 0 && p.off != total {
		_ = p.checkpoint()
		if p.off > total {
			_ = p.reset(url)
		}
		return &IncompleteError{URL: url, Got: p.off, Want: total}
	}
	return nil
}

// transferErr says why a request or its body failed: the caller's cancellation, a
// stall, or the network.
func (s *Store) transferErr(ctx, rctx context.Context, url string, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if errors.Is(context.Cause(rctx), errStalled) {
		return &StalledError{URL: url, After: s.stallTimeout.String()}
	}
	var denied *sourcepolicy.DeniedError
	if errors.As(err, &denied) {
		return fmt.Errorf("downloading %s: %w", url, denied)
	}
	return fmt.Errorf("downloading %s: %w", url, modelsource.Unreachable(url, err))
}

// finish verifies the complete partial file and renames it to its digest's name.
func (s *Store) finish(p *partial, src modelsource.Source, url, digest string) (path, got string, err error) {
	if err := p.f.Sync(); err != nil {
		return "", "", fmt.Errorf("model store: %w", err)
	}
	// The format first: an error page served as the file is better named as such than
	// as a checksum mismatch.
	magic := make([]byte, len(ggufMagic))
	n, _ := p.f.ReadAt(magic, 0)
	if string(magic[:n]) != ggufMagic {
		p.remove()
		return "", "", &FormatError{Location: url}
	}
	got = hex.EncodeToString(p.h.Sum(nil))
	if digest != "" && got != digest {
		p.remove()
		return "", "", &ChecksumError{Source: src.Raw, Expected: digest, Got: got, Of: "the downloaded file"}
	}
	path = s.blobPath(got)
	if _, err := os.Stat(path); err == nil {
		// Another source gave the same file.
		p.remove()
	} else {
		if err := os.Rename(p.path, path); err != nil {
			return "", "", fmt.Errorf("model store: %w", err)
		}
		_ = os.Remove(p.metaPath)
	}
	syncDir(s.blobs)
	return path, got, nil
}

// parseContentRange parses "bytes <first>-<last>/<size>" and "bytes */<size>"; size
// is -1 when the server wrote "*". first is -1 for the second form.
func parseContentRange(v string) (first, size int64, ok bool) {
	rest, found := strings.CutPrefix(v, "bytes ")
	if !found {
		return 0, 0, false
	}
	rng, sz, found := strings.Cut(rest, "/")
	if !found {
		return 0, 0, false
	}
	size = -1
	if sz != "*" {
		n, err := strconv.ParseInt(sz, 10, 64)
		if err != nil || n < 0 {
			return 0, 0, false
		}
		size = n
	}
	if rng == "*" {
		return -1, size, true
	}
	a, b, found := strings.Cut(rng, "-")
	if !found {
		return 0, 0, false
	}
	first, err1 := strconv.ParseInt(a, 10, 64)
	last, err2 := strconv.ParseInt(b, 10, 64)
	if err1 != nil || err2 != nil || first < 0 || last < first || (size >= 0 && last >= size) {
		return 0, 0, false
	}
	return first, size, true
}

// ctxReader stops reading when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(b)
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}
