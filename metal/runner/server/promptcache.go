//go:build cgo && !race

package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
	"github.com/macfleet/macfleet/metal/runner/llama"
)

// PromptCacheConfig configures the prompt cache (the --prompt-cache-* flags).
type PromptCacheConfig struct {
	// Dir is this runner's SSD tier directory; empty means no SSD tier. The states go
	// to Dir/<identity>/, and every other file under Dir counts toward the quota and
	// is evicted first: Dir must not be shared with another running runner.
	Dir string
	// HotBytes is the initial hot-tier budget (POST /cache/budget changes it); 0 keeps
	// nothing in memory.
	HotBytes int64
	// SSDBytes is the configured SSD quota (0: bounded by the free disk only).
	SSDBytes int64
	// BlockTokens is the block size of the prefix keys (default DefaultPromptCacheBlock).
	BlockTokens int
	// ModelID names the weights in the cache identity (e.g. the model's digest); empty
	// derives it from the file (see modelIdentity).
	ModelID string
}

// DefaultPromptCacheBlock is the default block size in tokens: a restore re-prefills
// at most this many tokens of the saved conversation.
const DefaultPromptCacheBlock = 64

// memoryLimitSlack is added to the hot budget for the Go runtime's soft memory limit
// (request bodies, states on their way to the SSD, SSD reads).
const memoryLimitSlack = 512 << 20

// promptTailTokens is how many of a prompt's last tokens the reference skips: a chat
// prompt ends with the template's generation prefix ("<|im_start|>assistant\n"), whose
// last tokens the next turn's prompt may tokenize differently, merged with the reply.
const promptTailTokens = 8

// restoreState is a cached state found for a prompt: restoring it and keeping its
// first n tokens spares their prefill.
type restoreState struct {
	n      int
	tokens []int32 // the first n tokens of the prompt
	state  []byte
	tier   promptcache.Tier
	found  time.Duration // how long the lookup took
}

// promptCache is the runner's side of the prompt cache: the identity of its states,
// the block size, and the two tiers. Lookups run on the request handlers, saves and
// restores on the engine goroutine (the only one touching the llama.cpp context).
type promptCache struct {
	log   logr.Logger
	id    promptcache.Identity
	block int
	c     *promptcache.Cache

	mu       sync.Mutex // guards closed and savers.Add
	closed   bool
	savers   sync.WaitGroup
	ssdQuota atomic.Int64

	// prefixes is the runner's prefix table (never nil once opened); refresh asks its
	// tracker to recompute the digests' tiers (see trackPrefixes).
	prefixes    *promptcache.PrefixTable
	refresh     chan struct{}
	stopTracker chan struct{}

	restores, restoredTokens, restoreFailures atomic.Int64
	statesSaved, savesSkipped, savesPending   atomic.Int64
	imports, importMisses, exports            atomic.Int64
	// In-flight prefixes (engine_inflight.go): jobs that waited on a slot prefilling
	// a prompt they share, those that took its KV and how many tokens, those that
	// gave up and prefilled normally.
	inflightWaits, inflightShares, inflightSharedTokens, inflightGiveUps atomic.Int64
}

// newPromptCache opens the tiers for the loaded model. kvType, nSeq and offload go
// into the state format: llama.cpp refuses (or would misread) a state of another KV
// type, stream count or backend layout.
func newPromptCache(log logr.Logger, cfg PromptCacheConfig, modelPath string, kvType string, nSeq int, offload string) (*promptCache, error) {
	block := cfg.BlockTokens
	if block <= 0 {
		block = DefaultPromptCacheBlock
	}
	modelID := cfg.ModelID
	if modelID == "" {
		var err error
		if modelID, err = modelIdentity(modelPath); err != nil {
			return nil, fmt.Errorf("prompt cache identity: %w", err)
		}
	}
	id := promptcache.Identity{
		Model:  modelID,
		Format: fmt.Sprintf("%s;state=v%d;kv=%s;seqs=%d;offload=%s", llama.EngineVersion(), blobVersion, kvType, nSeq, offload),
	}
	var ssd *promptcache.SSD
	if cfg.Dir != "" {
		var err error
		ssd, err = promptcache.Open(promptcache.SSDConfig{Dir: cfg.Dir, Identity: id, QuotaBytes: cfg.SSDBytes})
		if err != nil {
			return nil, fmt.Errorf("opening the prompt cache SSD tier: %w", err)
		}
	}
	pc := &promptCache{log: log, id: id, block: block, c: promptcache.New(promptcache.NewHot(cfg.HotBytes), ssd),
		refresh: make(chan struct{}, 1), stopTracker: make(chan struct{}), prefixes: promptcache.NewPrefixTable(newEpoch())}
	pc.ssdQuota.Store(cfg.SSDBytes)
	pc.setMemoryLimit(cfg.HotBytes)
	return pc, nil
}

// modelIdentity names the weights: a content-addressed file name (sha256-<hex>, as
// the agent's model store names blobs) is used as is; otherwise the file name plus a
// hash of its absolute path, size, modification time and first MiB (the GGUF header
// and metadata), so a replaced file never restores another model's states.
func modelIdentity(path string) (string, error) {
	base := filepath.Base(path)
	if h, ok := strings.CutPrefix(base, "sha256-"); ok && len(h) == 64 {
		if _, err := hex.DecodeString(h); err == nil {
			return base, nil
		}
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	f, err := os.Open(abs)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%d\x00%d\x00", abs, st.Size(), st.ModTime().UnixNano())
	if _, err := io.Copy(h, io.LimitReader(f, 1<<20)); err != nil {
		return "", err
	}
	return strings.TrimSuffix(base, filepath.Ext(base)) + "@" + hex.EncodeToString(h.Sum(nil)[:12]), nil
}

// setMemoryLimit keeps the Go heap near what the hot tier may hold: without a limit
// the collector lets garbage (evicted states) grow to the size of the live heap
// before it runs, doubling the runner's footprint.
func (pc *promptCache) setMemoryLimit(hotBytes int64) {
	limit := int64(math.MaxInt64)
	if hotBytes > 0 {
		limit = hotBytes + memoryLimitSlack
	}
	debug.SetMemoryLimit(limit)
}

// active reports whether a state could be stored or found anywhere.
func (pc *promptCache) active() bool {
	return pc != nil && (pc.c.SSD != nil || pc.c.Hot.Stats().BudgetBytes > 0)
}

// lookup finds the longest cached prefix of tokens, hot tier first, then the SSD: the
// deepest block key found, extended to every token its state shares with the prompt.
// align (nil: none) may give the prompt other tokens that share more with the state;
// lookup returns the tokens to generate from. It leaves the last token out: a
// generation must prefill at least one token to get logits. It runs on the request's
// handler, so SSD reads never stall the engine.
func (pc *promptCache) lookup(tokens []int32, partition string, align func(saved []int32) []int32) (*restoreState, []int32) {
	if !pc.active() || len(tokens) < 2 {
		return nil, tokens
	}
	start := time.Now()
	keys := promptcache.BlockKeys(pc.id, partition, tokens[:len(tokens)-1], pc.block)
	for len(keys) > 0 {
		depth, data, tier := pc.c.Longest(keys)
		if depth == 0 {
			return nil, tokens
		}
		n := depth * pc.block
		r, err := pc.resolve(data, tokens[:n])
		if err == nil {
			// The state usually holds more than the block-aligned key: the rest of the
			// last turn's prompt and its answer. Restore all that the prompt shares.
			if align != nil {
				tokens = align(r.tokens)
			}
			n = commonPrefix(r.tokens, tokens[:len(tokens)-1])
			r.tokens = r.tokens[:n]
			r.n, r.tier, r.found = n, tier, time.Since(start)
			return r, tokens
		}
		// A dangling reference, or an entry that does not hold these tokens (which a
		// key collision would take): drop it and look for a shallower one.
		pc.log.V(1).Info("Dropping an unusable prompt cache entry", "tokens", n, "tier", tier, "reason", err.Error())
		pc.forget(keys[depth-1])
		keys = keys[:depth-1]
	}
	return nil, tokens
}

// resolve follows a reference and checks that the state holds want.
func (pc *promptCache) resolve(data []byte, want []int32) (*restoreState, error) {
	toks, state, ref, isRef, err := decodeBlob(data)
	if err != nil {
		return nil, err
	}
	if isRef {
		data, ok := pc.c.Hot.Get(ref)
		if !ok && pc.c.SSD != nil {
			if data, ok = pc.c.SSD.Load(ref); ok && !pc.c.NoPromote {
				pc.c.Hot.Put(ref, data)
			}
		}
		if !ok {
			return nil, errors.New("the referenced state is gone")
		}
		if toks, state, _, isRef, err = decodeBlob(data); err != nil {
			return nil, err
		}
		if isRef {
			return nil, errors.New("a reference to a reference")
		}
	}
	if len(toks) < len(want) || !slices.Equal(toks[:len(want)], want) {
		return nil, errors.New("the state holds other tokens")
	}
	return &restoreState{tokens: toks, state: state}, nil
}

// forget drops key from both tiers without waiting on the caller (the SSD tier may
// wait for its writer).
func (pc *promptCache) forget(key promptcache.Key) {
	pc.c.Hot.Remove(key)
	pc.changed()
	if pc.c.SSD == nil {
		return
	}
	if !pc.addSaver() {
		return
	}
	go func() {
		defer pc.savers.Done()
		if _, err := pc.c.SSD.Forget(key); err != nil {
			pc.log.V(1).Info("Forgetting a prompt cache entry", "error", err.Error())
		}
	}()
}

func (pc *promptCache) addSaver() bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.closed {
		return false
	}
	pc.savers.Add(1)
	return true
}

// save stores the state of a slot holding tokens (prompt + generated, the first
// promptLen of them the prompt) under the key of its deepest full block, and a
// reference to it under the key of every full block of the prompt without its last
// promptTailTokens (see putRefs). state is called (on the engine goroutine) to
// serialize the sequence after the header. It returns the state's key (ok false when
// nothing was saved).
func (pc *promptCache) save(tokens []int32, promptLen int, partition string, stateSize int, state func(header []byte) []byte) (full promptcache.Key, ok bool) {
	if !pc.active() {
		return full, false
	}
	keys := promptcache.BlockKeys(pc.id, partition, tokens, pc.block)
	if len(keys) == 0 {
		pc.savesSkipped.Add(1)
		return full, false
	}
	size := int64(blobHeader + 4*len(tokens) + stateSize)
	if pc.c.SSD == nil && size > pc.c.Hot.Stats().BudgetBytes {
		pc.savesSkipped.Add(1) // the hot tier would refuse it: spare the copy
		return full, false
	}
	blob := state(encodeStateHeader(tokens))
	if len(blob) <= blobHeader+4*len(tokens) {
		pc.savesSkipped.Add(1)
		return full, false
	}
	pc.statesSaved.Add(1)
	full = keys[len(keys)-1]
	pc.put(full, blob)
	if pd := (promptLen - promptTailTokens) / pc.block; pd >= 1 && pd < len(keys) {
		pc.putRefs(keys[:pd], encodeRef(full))
	}
	return full, true
}

// putRefs stores ref under the deepest of keys as put does, and under each shallower
// key that holds nothing yet: another conversation that shares only the start of this
// prompt (a long system prompt, the tools) finds the state under the deepest block
// they share and restores it trimmed to the shared tokens. A key that holds something
// keeps it (a state there holds the same tokens; a reference there is as good unless
// its state is gone, and lookup drops it then). The shallower references go to the
// SSD tier in order on one goroutine; the SSD tier skips keys it already stores.
func (pc *promptCache) putRefs(keys []promptcache.Key, ref []byte) {
	deepest := keys[len(keys)-1]
	pc.put(deepest, ref)
	var fresh []promptcache.Key
	for _, k := range keys[:len(keys)-1] {
		if !pc.c.Hot.Has(k) {
			pc.c.Hot.Put(k, ref)
			fresh = append(fresh, k)
		}
	}
	if pc.c.SSD == nil || len(fresh) == 0 || !pc.addSaver() {
		return
	}
	pc.savesPending.Add(int64(len(fresh)))
	// Pending in the SSD tier from now (SaveLater), written in order on one goroutine.
	queues := make([]func() error, len(fresh))
	for i, k := range fresh {
		queues[i] = pc.c.SSD.SaveLater(k, ref)
	}
	go func() {
		defer pc.savers.Done()
		failed := false
		for _, queue := range queues {
			err := queue() // every one, even after a failure: each is waited for
			pc.savesPending.Add(-1)
			if err != nil && !failed && !errors.Is(err, promptcache.ErrClosed) {
				failed = true
				pc.log.Info("Saving a prompt cache reference to the SSD tier failed", "error", err.Error())
			}
		}
	}()
}

// put stores data in the hot tier at once and hands it to the SSD tier on another
// goroutine (a full queue makes SSD.Save wait up to a second, then write inline).
func (pc *promptCache) put(key promptcache.Key, data []byte) {
	pc.c.Hot.Put(key, data)
	if pc.c.SSD == nil || !pc.addSaver() {
		return
	}
	pc.savesPending.Add(1)
	// Pending in the SSD tier from now (SaveLater): a state the hot tier refused is
	// held somewhere when the prefix table next looks (noteSaved refreshes it at once).
	queue := pc.c.SSD.SaveLater(key, data)
	go func() {
		defer pc.savers.Done()
		defer pc.savesPending.Add(-1)
		if err := queue(); err != nil && !errors.Is(err, promptcache.ErrClosed) {
			pc.log.Info("Saving a prompt cache state to the SSD tier failed", "error", err.Error())
		}
	}()
}

// setBudget applies a new hot budget and/or SSD quota.
func (pc *promptCache) setBudget(b runnerapi.CacheBudget) runnerapi.CacheBudgetResult {
	var res runnerapi.CacheBudgetResult
	if b.HotBytes != nil {
		res.EvictedBytes, res.EvictedEntries = pc.c.Hot.SetBudget(*b.HotBytes)
		pc.setMemoryLimit(*b.HotBytes)
		if res.EvictedBytes > 0 {
			debug.FreeOSMemory()
		}
	}
	if b.SSDBytes != nil {
		pc.ssdQuota.Store(*b.SSDBytes)
		if pc.c.SSD != nil {
			pc.c.SSD.SetQuota(*b.SSDBytes)
		}
	}
	res.HotBytes = pc.c.Hot.Stats().BudgetBytes
	res.SSDBytes = pc.ssdQuota.Load()
	pc.changed()
	return res
}

// clearHot empties the hot tier and returns the freed heap to the operating system.
func (pc *promptCache) clearHot() (bytes int64, entries int) {
	bytes, entries = pc.c.Hot.Clear()
	pc.changed()
	debug.FreeOSMemory()
	return bytes, entries
}

// status is the prompt cache part of /status.
func (pc *promptCache) status() *runnerapi.PromptCacheStatus {
	st := pc.c.Stats()
	out := &runnerapi.PromptCacheStatus{
		BlockTokens: pc.block, Model: pc.id.Model, Format: pc.id.Format,
		Restores: pc.restores.Load(), RestoredTokens: pc.restoredTokens.Load(), RestoreFailures: pc.restoreFailures.Load(),
		StatesSaved: pc.statesSaved.Load(), SavesSkipped: pc.savesSkipped.Load(), SavesPending: pc.savesPending.Load(),
		PeerImports: pc.imports.Load(), PeerImportMisses: pc.importMisses.Load(), PeerExports: pc.exports.Load(),
		InflightWaits: pc.inflightWaits.Load(), InflightShares: pc.inflightShares.Load(),
		InflightSharedTokens: pc.inflightSharedTokens.Load(), InflightGiveUps: pc.inflightGiveUps.Load(),
		Hot: runnerapi.PromptCacheHot{
			Entries: st.Hot.Entries, Bytes: st.Hot.Bytes, BudgetBytes: st.Hot.BudgetBytes, Hits: st.Hot.Hits,
			Misses: st.Hot.Misses, Puts: st.Hot.Puts, Evictions: st.Hot.Evictions, Rejected: st.Hot.Rejected,
		},
	}
	if s := st.SSD; s != nil {
		out.Dir = pc.c.SSD.Dir()
		out.SSD = &runnerapi.PromptCacheSSD{
			Saves: s.Saves, SavesPersisted: s.SavesPersisted, Duplicates: s.Duplicates, QuotaRejects: s.QuotaRejects,
			Cancelled: s.Cancelled, Errors: s.Errors, Hits: s.Hits, Misses: s.Misses, Corrupt: s.Corrupt,
			Evictions: s.Evictions, UnlinkFailures: s.UnlinkFailures, InlineFallbacks: s.InlineFallbacks,
			Entries: s.Entries, Bytes: s.Bytes, ForeignBytes: s.ForeignBytes, ForeignFiles: s.ForeignFiles,
			QuotaBytes: s.QuotaBytes, FreeBytes: s.FreeBytes, Queued: s.Queued,
		}
	}
	return out
}

// close waits for the saves handed to the SSD tier, lets its writer drain the queue
// (bounded by ctx) and drops the hot tier.
func (pc *promptCache) close(ctx context.Context) error {
	pc.mu.Lock()
	pc.closed = true
	pc.mu.Unlock()
	pc.savers.Wait()
	err := pc.c.Close(ctx)
	close(pc.stopTracker)
	return err
}
