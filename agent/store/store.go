// Package store is the node agent's persistent model store: it downloads the GGUF files
// that ModelDeployments name (http(s)://, hf://, ollama:// registry blobs) and checks
// file:// ones in place.
//
// Layout under the store's directory:
//
//	blobs/sha256-<hex>             a complete, verified file, named by its SHA-256
//	blobs/src-<hash>.partial       a download in progress (hash of the source)
//	blobs/<name>.partial.json      what a resume needs: URL, validators, size, hash state
//	refs/<hash>.json               source → digest of the file it last gave, so that a
//	                               source without sha256 is found again without network;
//	                               a file is handed only to the sources whose record
//	                               names it (verifiedFrom)
//	local/<hash>.json              a file:// source's SHA-256 keyed by size, mtime and inode
//	used/sha256-<hex>              an empty file whose mtime is the last use of that blob
//	parts/<hash>/NAME-0000i-of-0000N.gguf
//	                               a link to the blob of each part of a model stored in
//	                               parts, by the name the runner looks it up by (parts.go)
//
// Downloads resume with Range/If-Range requests (from the same source only), are
// hashed as they arrive and become visible only after verification, by an atomic
// rename. Every Fetch of the same file
// waits for one download; a file lock on the partial keeps two agents sharing a
// directory from writing it at once.
//
// Nothing is deleted unless Prune is called (prune.go): it removes the files no model in
// use needs that no agent sharing the directory used for a retention period.
package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// Defaults for Options left zero.
const (
	DefaultProgressInterval      = 500 * time.Millisecond
	DefaultStallTimeout          = time.Minute
	DefaultResponseHeaderTimeout = time.Minute
	// manifestTimeout bounds resolving an ollama manifest.
	manifestTimeout = time.Minute
)

// Options configure a Store.
type Options struct {
	// HFEndpoint is the Hugging Face hub (modelsource.DefaultHFEndpoint when empty).
	HFEndpoint string
	// HFToken, when set, is sent as a bearer token with hf:// downloads (gated models).
	// The HTTP client drops it on redirects to other hosts.
	HFToken string
	// HFTokenSource, when set and HFToken is empty, gives the token for each hf://
	// request (the fleet's hub token Secret, read with the node's credential); "" sends
	// none.
	HFTokenSource func(context.Context) string
	// OllamaRegistry is the ollama registry (modelsource.DefaultOllamaRegistry when empty).
	OllamaRegistry string
	// HTTPClient makes every request. It must not have an overall Timeout: downloads
	// take as long as they take; stalls are caught by StallTimeout. When nil, a client
	// with DefaultResponseHeaderTimeout. An *http.Transport (or none) is cloned to dial
	// through Policy's address check and no proxy; another RoundTripper is used as it
	// is, unchecked. Redirects are checked against Policy whatever the client.
	HTTPClient *http.Client
	// Policy is the fleet's source policy: which sources each namespace may fetch,
	// which directories its file:// sources may be in, and which addresses downloads
	// may connect to (checked on every connection, redirects included). When nil,
	// sourcepolicy.Default(): hf:// and ollama:// only, no loopback, link-local or
	// private (LAN) addresses.
	Policy *sourcepolicy.Holder
	// Log receives the store's V(2) messages.
	Log logr.Logger
	// Clock times progress reports; the real clock when nil.
	Clock clock.PassiveClock
	// ProgressInterval is the longest a download goes without a progress report while
	// bytes arrive (DefaultProgressInterval when zero); a report is also due every 1%.
	ProgressInterval time.Duration
	// LocalFileDirs, when not empty, confines file:// sources to these directories on
	// this machine, on top of Policy's fileDirectories (the Mac owner's own limit).
	LocalFileDirs []string
	// MaxModelBytes, when positive, caps the size of a download: a file announced
	// larger is refused before a byte is stored, and one that turns out larger is
	// discarded once it passes the cap (a *TooLargeError either way). file:// sources
	// are not capped: they take no space.
	MaxModelBytes int64
	// Capacity, when positive, is the most bytes the files under the store's
	// directory may take together, whatever else its file system holds: a download
	// that does not fit in what is left fails as on a full disk (*DiskSpaceError).
	Capacity int64
	// StallTimeout aborts a download that receives nothing for this long
	// (DefaultStallTimeout when zero); the partial file is kept.
	StallTimeout time.Duration
}

// Store is a directory of model files. Its methods are safe for concurrent use.
type Store struct {
	dir, blobs, refs, local, used, parts string

	locator          *Locator
	resolver         *modelsource.Resolver
	client           *http.Client
	policy           *sourcepolicy.Holder
	hfToken          hubToken
	log              logr.Logger
	clock            clock.PassiveClock
	progressInterval time.Duration
	stallTimeout     time.Duration
	maxBytes         int64
	capacity         int64
	localDirs        []string

	mu      sync.Mutex
	flights map[string]*flight
	// pruneMu serializes Prune calls.
	pruneMu sync.Mutex
}

// New opens (creating it if needed) the store in dir. Files completed by an earlier
// Store on the same directory are found without network.
func New(dir string, opts Options) (*Store, error) {
	if dir == "" {
		return nil, errors.New("model store: no directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("model store %s: %w", dir, err)
	}
	s := &Store{
		dir:              abs,
		blobs:            filepath.Join(abs, "blobs"),
		refs:             filepath.Join(abs, "refs"),
		local:            filepath.Join(abs, "local"),
		used:             filepath.Join(abs, "used"),
		parts:            filepath.Join(abs, "parts"),
		policy:           opts.Policy,
		hfToken:          hubToken{static: opts.HFToken, source: opts.HFTokenSource},
		log:              opts.Log,
		clock:            opts.Clock,
		progressInterval: opts.ProgressInterval,
		stallTimeout:     opts.StallTimeout,
		maxBytes:         opts.MaxModelBytes,
		capacity:         opts.Capacity,
		localDirs:        opts.LocalFileDirs,
		flights:          map[string]*flight{},
	}
	for _, d := range []string{s.blobs, s.refs, s.local, s.used, s.parts} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("model store: %w", err)
		}
	}
	// The locator's client checks each connection and redirect against the policy.
	s.locator = NewLocator(opts)
	s.policy, s.client, s.resolver = s.locator.policy, s.locator.client, s.locator.resolver
	if s.clock == nil {
		s.clock = clock.RealClock{}
	}
	if s.progressInterval <= 0 {
		s.progressInterval = DefaultProgressInterval
	}
	if s.stallTimeout <= 0 {
		s.stallTimeout = DefaultStallTimeout
	}
	s.removeTemp()
	return s, nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Fetch returns the path of a verified local copy of the model at rawSource for a
// replica in namespace, downloading it if the store does not hold it yet. The source
// policy decides first whether namespace may use rawSource (a *sourcepolicy.DeniedError
// otherwise). sha256 (64 hex digits, optionally
// prefixed "sha256:") is verified when given; an ollama:// source is verified against
// its registry digest in any case. file:// sources are not copied: the file is checked
// in place (below a directory the policy allows namespace after resolving symbolic
// links, exists, regular, GGUF magic, sha256 when given) and its resolved path
// returned.
//
// progress, when not nil, is called (possibly from another goroutine, never
// concurrently, never after Fetch returns) when the transfer starts, then every 1% or
// ProgressInterval while bytes arrive, and with (size, size) on success; total is -1
// while unknown. Hashing a file:// source reports the same way. A slow callback slows
// the download it watches.
//
// A source naming the first part of a model stored in parts (NAME-00001-of-0000N.gguf)
// fetches every part, each a file of its own as above (file:// parts are checked in
// place); the path returned is the first part's, every other part beside it under its
// own name, as the runner looks them up (parts.go). sha256, which names one file, is
// refused for such a source; progress counts the bytes of every part, its total -1
// until each part's is known.
//
// Concurrent calls for the same file share one download. When ctx is done Fetch
// returns; the download stops once no caller waits for it, and its partial file is
// kept for the next Fetch to resume. Errors say which source failed; see Retryable.
func (s *Store) Fetch(ctx context.Context, namespace, rawSource, sha256 string, progress func(done, total int64)) (string, error) {
	return s.fetch(ctx, namespace, rawSource, sha256, nil, progress)
}

// fetch is Fetch, or FetchLayers with layers.
func (s *Store) fetch(ctx context.Context, namespace, rawSource, sha256 string, layers *LayerRange, progress func(done, total int64)) (string, error) {
	want, err := normalizeDigest(rawSource, sha256)
	if err != nil {
		return "", err
	}
	src, err := modelsource.Parse(rawSource)
	if err != nil {
		return "", err
	}
	policy := s.policy.Policy()
	if err := policy.DecideSource(namespace, rawSource).Err(namespace, rawSource); err != nil {
		return "", err
	}
	if src.Scheme == modelsource.HTTP {
		// Redirects must stay on hosts the namespace may use.
		ctx = sourcepolicy.ForSource(ctx, namespace, rawSource)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("fetching %s: %w", rawSource, err)
	}
	r := fetchReq{namespace: namespace, policy: policy, src: src, want: want, progress: progress, layers: layers}
	switch {
	case src.Parts > 1 && want != "":
		return "", &DigestError{Source: rawSource, Digest: sha256,
			Reason: "names one file, and the source names a model stored in parts, each part checked on its own: leave sha256 out"}
	case src.Parts > 1:
		return s.fetchParts(ctx, r)
	case src.Scheme == modelsource.File:
		return s.fetchLocal(ctx, r)
	}
	return s.fetchFile(ctx, r)
}

// fetchReq is one file (or model in parts) to fetch and what goes with it.
type fetchReq struct {
	namespace string
	policy    *sourcepolicy.Policy
	src       modelsource.Source
	// want is the lowercase hex SHA-256 asked for, or "".
	want     string
	progress func(done, total int64)
	// layers, for a model in parts, fetches only the parts holding them (FetchLayers).
	layers *LayerRange
}

// fetchLocal checks a file:// source in place and returns its resolved path.
func (s *Store) fetchLocal(ctx context.Context, r fetchReq) (string, error) {
	namespace, policy, src, want := r.namespace, r.policy, r.src, r.want
	real, err := allowedLocalPath(src.LocalPath, policy.FileDirectories(namespace), "allowed for its namespace")
	if err != nil {
		return "", &sourcepolicy.DeniedError{Namespace: namespace, Source: src.Raw, Reason: err.Error() +
			fmt.Sprintf(": add its directory to spec.rules[].fileDirectories of a rule for namespace %q in %s", namespace, policy.Name())}
	}
	if len(s.localDirs) > 0 {
		if _, err := allowedLocalPath(src.LocalPath, s.localDirs, "this Mac allows"); err != nil {
			return "", &sourcepolicy.DeniedError{Namespace: namespace, Source: src.Raw,
				Reason: err.Error() + ": the Mac's agent opens files only under its --allow-file-dir directories"}
		}
	}
	return s.join(ctx, "file:"+real+"@"+want, src.Raw, r.progress, func(ctx context.Context, report func(int64, int64)) (string, int64, error) {
		return s.verifyLocal(ctx, src, real, want, report)
	})
}

// fetchFile returns the path of the store's file of a remote source of one file,
// downloading it if needed, with its use recorded.
func (s *Store) fetchFile(ctx context.Context, r fetchReq) (string, error) {
	src := r.src
	for attempt := 0; ; attempt++ {
		p, err := s.fetchStored(ctx, src, src.Raw, r.want, r.progress)
		if err != nil {
			return "", err
		}
		// Recording the use is what keeps a concurrent Prune from removing the file.
		switch err := s.markUsed(p); {
		case err == nil:
			return p, nil
		case !errors.Is(err, errPruned):
			s.log.V(2).Info("Cannot record the use of a model file", "path", p, "err", err.Error())
			return p, nil
		case attempt == maxPrunedRetries:
			return "", fmt.Errorf("fetching %s: %w %d times in a row", src.Raw, err, attempt+1)
		}
		s.log.V(2).Info("The stored file was pruned while fetching it; fetching it again", "source", src.Raw, "path", p)
	}
}

// fetchStored returns the path of the store's file of src, downloading it if needed.
func (s *Store) fetchStored(ctx context.Context, src modelsource.Source, rawSource, want string, progress func(done, total int64)) (string, error) {
	// What this source already gave needs no network. A file that only another
	// source gave is not handed out on its digest alone: it is downloaded from src
	// and verified (see verifiedFrom).
	digest := want
	if digest == "" {
		digest = s.readRef(src)
	}
	if s.verifiedFrom(src, digest) {
		if p, size, ok := s.complete(digest); ok {
			if progress != nil {
				progress(size, size)
			}
			return p, nil
		}
	}

	// One flight per source (and digest asked for): two sources of the same digest
	// never share a download, whose bytes would come from only one of them.
	key := "src:" + src.String()
	if want != "" {
		key += "@sha256:" + want
	}
	return s.join(ctx, key, rawSource, progress, func(ctx context.Context, report func(int64, int64)) (string, int64, error) {
		return s.download(ctx, src, want, report)
	})
}

// verifiedFrom reports whether the store's file of digest was verified from src: src's
// record (refs/, written after each verified download) names that digest, as the
// file it gave last or one it gave before (a deployment pinned to an older file of a
// source that changed keeps its stored copy). It is what
// lets a file be shared: between the deployments that may use the same source, and no
// others. A digest is not a capability: a deployment that names another's digest
// with a source of its own gets what its own source serves, checked against the
// digest, not the stored file. Nothing else needs recording: a source is fetched with
// the agent's credentials alone (the hub token), so whoever may use the source may
// read what it gives.
//
// Files stored before this rule have the same records, so every source that
// downloaded one still finds it without network; another source of the same digest
// downloads it once, from itself.
func (s *Store) verifiedFrom(src modelsource.Source, digest string) bool {
	if digest == "" {
		return false
	}
	r := s.loadRef(src)
	return r.Digest == digest || slices.Contains(r.Earlier, digest)
}

// normalizeDigest returns the lowercase hex of a sha256 argument, or "" for none.
func normalizeDigest(src, d string) (string, error) {
	if d == "" {
		return "", nil
	}
	h := strings.ToLower(strings.TrimPrefix(d, "sha256:"))
	if len(h) != sha256.Size*2 {
		return "", &DigestError{Source: src, Digest: d, Reason: "is not a SHA-256: want 64 hexadecimal digits"}
	}
	if _, err := hex.DecodeString(h); err != nil {
		return "", &DigestError{Source: src, Digest: d, Reason: "is not a SHA-256: want 64 hexadecimal digits"}
	}
	return h, nil
}

// blobPath is where the verified file of a digest lives.
func (s *Store) blobPath(digest string) string {
	return filepath.Join(s.blobs, "sha256-"+digest)
}

// complete reports whether the store holds the file of digest.
func (s *Store) complete(digest string) (string, int64, bool) {
	p := s.blobPath(digest)
	fi, err := os.Stat(p)
	if err != nil || !fi.Mode().IsRegular() {
		return "", 0, false
	}
	return p, fi.Size(), true
}

// hashName is a file name for an arbitrary string (a source, a path).
func hashName(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:16])
}

type ref struct {
	Source string `json:"source"`
	// Digest is the file the source gave last.
	Digest string `json:"digest"`
	// Earlier are files it gave before (the newest last, at most maxEarlierDigests):
	// still its own, for deployments pinned to them (verifiedFrom).
	Earlier []string `json:"earlier,omitempty"`
}

// maxEarlierDigests bounds ref.Earlier.
const maxEarlierDigests = 8

func (s *Store) refPath(src modelsource.Source) string {
	return filepath.Join(s.refs, hashName(src.String())+".json")
}

// readRef returns the digest of the file src gave last time, or "".
func (s *Store) readRef(src modelsource.Source) string {
	return s.loadRef(src).Digest
}

// loadRef returns src's record; empty when there is none or it is unusable.
func (s *Store) loadRef(src modelsource.Source) ref {
	b, err := os.ReadFile(s.refPath(src))
	if err != nil {
		return ref{}
	}
	var r ref
	if json.Unmarshal(b, &r) != nil || r.Source != src.String() {
		return ref{}
	}
	if _, err := normalizeDigest("", r.Digest); err != nil {
		return ref{}
	}
	return r
}

// writeRef records that src gave the file of digest, keeping the files it gave
// before.
func (s *Store) writeRef(src modelsource.Source, digest string) {
	old := s.loadRef(src)
	r := ref{Source: src.String(), Digest: digest}
	for _, d := range append(old.Earlier, old.Digest) {
		if d != "" && d != digest && !slices.Contains(r.Earlier, d) {
			r.Earlier = append(r.Earlier, d)
		}
	}
	if n := len(r.Earlier); n > maxEarlierDigests {
		r.Earlier = r.Earlier[n-maxEarlierDigests:]
	}
	b, _ := json.Marshal(r)
	if err := writeFileAtomic(s.refPath(src), b); err != nil {
		s.log.V(2).Info("Cannot record the digest of a source", "source", src.String(), "err", err.Error())
	}
}

const tempSuffix = ".tmp"

// writeFileAtomic replaces path with b: a reader sees the old or the new content.
func writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*"+tempSuffix)
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// staleTemp is the age after which a temporary file is surely abandoned (another agent
// sharing the directory may be writing a young one).
const staleTemp = time.Hour

// removeTemp deletes what interrupted writeFileAtomic calls left. Partial downloads stay.
func (s *Store) removeTemp() {
	for _, d := range []string{s.blobs, s.refs, s.local} {
		entries, _ := os.ReadDir(d)
		for _, e := range entries {
			if e.IsDir() || !strings.HasSuffix(e.Name(), tempSuffix) {
				continue
			}
			if fi, err := e.Info(); err == nil && s.clock.Since(fi.ModTime()) > staleTemp {
				_ = os.Remove(filepath.Join(d, e.Name()))
			}
		}
	}
}
