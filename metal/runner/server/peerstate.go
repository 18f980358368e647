//go:build cgo && !race

package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
)

// The runner's side of a peer fetch (runnerapi.PeerStateResult): GET
// /cache/states/{digest} exports the state that backs a prefix digest as one entry in
// the SSD file format; POST /cache/states checks such an entry and keeps it like a
// state the runner saved itself. Neither touches the engine: an export reads the hot
// tier's bytes or streams the SSD file, an import writes the tiers as a save does.

// importReadChunk bounds the memory an import allocates ahead of the bytes received.
const importReadChunk = 64 << 20

// exportEntry is a state on its way out: its entry (header and payload) in body.
type exportEntry struct {
	key    promptcache.Key
	tokens int
	size   int64
	body   io.Reader
	close  func()
}

// exportState finds the state that backs digest for partition, the backing that
// spares the most tokens first (hot tier, else SSD): nil when no tier holds one of
// partition.
func (pc *promptCache) exportState(digest, partition string) *exportEntry {
	for _, b := range pc.prefixes.Backings(digest) {
		if e := pc.exportKey(b.State, partition, 1); e != nil {
			return e
		}
	}
	return nil
}

// exportKey is the state under key (following at most refs references) if it belongs
// to partition: its key must be the one its tokens give in that partition.
func (pc *promptCache) exportKey(key promptcache.Key, partition string, refs int) *exportEntry {
	owns := func(tokens []int32) bool {
		k, ok := promptcache.StateKey(pc.id, partition, tokens, pc.block)
		return ok && k == key
	}
	if data, ok := pc.c.Hot.Peek(key); ok {
		tokens, _, ref, isRef, err := decodeBlob(data)
		switch {
		case err == nil && isRef && refs > 0:
			return pc.exportKey(ref, partition, refs-1)
		case err == nil && !isRef && owns(tokens):
			h := promptcache.EncodeEntryHeader(pc.id, key, data)
			return &exportEntry{key: key, tokens: len(tokens), size: int64(len(h) + len(data)),
				body: io.MultiReader(bytes.NewReader(h), bytes.NewReader(data)), close: func() {}}
		}
	}
	if pc.c.SSD == nil {
		return nil
	}
	f, size, err := pc.c.SSD.OpenEntry(key)
	if err != nil {
		return nil
	}
	payload := io.NewSectionReader(f, promptcache.EntryHeaderSize, size-promptcache.EntryHeaderSize)
	tokens, ref, isRef, err := readBlobStart(payload, payload.Size())
	f.Close()
	switch {
	case err == nil && isRef && refs > 0:
		return pc.exportKey(ref, partition, refs-1)
	case err != nil || isRef || !owns(tokens):
		return nil
	}
	// Reopened for the whole entry: the header was checked again, and an open file
	// stays readable if the tier evicts it while it streams.
	if f, size, err = pc.c.SSD.OpenEntry(key); err != nil {
		return nil
	}
	return &exportEntry{key: key, tokens: len(tokens), size: size, body: f, close: func() { f.Close() }}
}

// importLimit is the largest payload an import takes: what the larger tier can hold,
// at most promptcache.MaxPeerStateBytes.
func (pc *promptCache) importLimit() int64 {
	limit := pc.c.Hot.Stats().BudgetBytes
	if pc.c.SSD != nil {
		limit = max(limit, pc.c.SSD.Stats().QuotaBytes)
	}
	return min(limit, promptcache.MaxPeerStateBytes)
}

// importState reads an entry from body, checks it (promptcache.CheckImport) and keeps
// it: the state under its key in both tiers, a reference to it under every shallower
// full block (a prompt that extends only part of it finds it), digests associated
// with it. A state longer than slotCtx tokens is refused as incompatible. It returns
// the HTTP status and the result.
func (pc *promptCache) importState(body io.Reader, partition string, digests []string, slotCtx int) (int, runnerapi.PeerStateResult) {
	fail := func(status int, m *promptcache.ImportMiss) (int, runnerapi.PeerStateResult) {
		return status, runnerapi.PeerStateResult{Reason: m.Reason, Detail: m.Detail}
	}
	corrupt := func(format string, args ...any) (int, runnerapi.PeerStateResult) {
		return fail(http.StatusUnprocessableEntity, &promptcache.ImportMiss{Reason: runnerapi.PeerMissCorrupt, Detail: fmt.Sprintf(format, args...)})
	}
	limit := pc.importLimit()
	h := make([]byte, promptcache.EntryHeaderSize)
	if n, err := io.ReadFull(body, h); err != nil {
		return corrupt("the entry ends in its header (%d bytes): %v", n, err)
	}
	// The header is checked before a byte of the payload is read or allocated.
	_, n, _, m := promptcache.CheckImportHeader(h, pc.id, limit)
	if m != nil {
		status := http.StatusUnprocessableEntity
		if m.Reason == runnerapi.PeerMissTooLarge {
			status = http.StatusRequestEntityTooLarge
		}
		return fail(status, m)
	}
	payload, err := readPayload(body, n)
	if err != nil {
		return corrupt("%v", err)
	}
	imp, m := promptcache.CheckImport(h, payload, pc.id, partition, pc.block, limit, stateTokens)
	if m == nil && len(imp.Tokens) > slotCtx {
		// The identity leaves the context size out (it does not change a state's bytes),
		// but a state longer than a slot could never be restored here.
		m = &promptcache.ImportMiss{Reason: runnerapi.PeerMissIncompatible,
			Detail: fmt.Sprintf("the state holds %d tokens, a slot here holds %d", len(imp.Tokens), slotCtx)}
	}
	if m != nil {
		return fail(http.StatusUnprocessableEntity, m)
	}
	pc.put(imp.Key, imp.Payload)
	if d := len(imp.BlockKeys) - 1; d >= 1 {
		pc.putRefs(imp.BlockKeys[:d], encodeRef(imp.Key))
	}
	pc.imports.Add(1)
	pc.noteSaved(digests, imp.Key, len(imp.Tokens), int64(len(h)+len(payload)), len(imp.Tokens))
	return http.StatusOK, runnerapi.PeerStateResult{Imported: true, Tokens: len(imp.Tokens), Bytes: int64(len(h) + len(payload))}
}

// readPayload reads exactly n bytes and then the end of body, allocating as the bytes
// arrive (a header that claims more than is sent costs no more than what was sent).
func readPayload(body io.Reader, n int64) ([]byte, error) {
	buf := make([]byte, 0, min(n, importReadChunk))
	for int64(len(buf)) < n {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, int(min(n-int64(len(buf)), int64(cap(buf)))))
		}
		k, err := body.Read(buf[len(buf):min(int64(cap(buf)), n)])
		buf = buf[:len(buf)+k]
		switch {
		case err == io.EOF && int64(len(buf)) < n:
			return nil, fmt.Errorf("the payload ends after %d of its %d bytes", len(buf), n)
		case err != nil && err != io.EOF:
			return nil, fmt.Errorf("reading the payload: %v", err)
		}
	}
	var one [1]byte
	if k, err := io.ReadFull(body, one[:]); k > 0 {
		return nil, errors.New("bytes follow the payload")
	} else if err != io.EOF {
		return nil, fmt.Errorf("reading past the payload: %v", err)
	}
	return buf, nil
}

// cacheOff is the 409 of the cache's endpoints when no state could be stored or
// found; why names the model's reason ("" when the cache was configured off).
func cacheOff(why string) *runnerapi.Error {
	return &runnerapi.Error{Status: http.StatusConflict, Type: runnerapi.TypeInvalidRequest,
		Code: runnerapi.PeerMissDisabled, Message: cacheOffMessage(why)}
}

func cacheOffMessage(why string) string {
	if why == "" {
		return "this runner's prompt cache is off"
	}
	return "this runner's prompt cache is " + why
}

// handleExportState is GET /cache/states/{digest} (runnerapi.HeaderCachePartition:
// the partition the state must belong to).
func (cs *cacheStore) handleExportState(w http.ResponseWriter, r *http.Request) {
	if _, herr := cs.run.engine(); herr != nil {
		writeError(w, herr)
		return
	}
	digest := r.PathValue("digest")
	if len(promptcache.ParseDigests(digest)) != 1 {
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "digest", "a digest is 16 lowercase hex digits, got %q", digest))
		return
	}
	if !cs.pc.active() {
		writeError(w, cacheOff(cs.off))
		return
	}
	e := cs.pc.exportState(digest, r.Header.Get(runnerapi.HeaderCachePartition))
	if e == nil {
		writeError(w, &runnerapi.Error{Status: http.StatusNotFound, Type: runnerapi.TypeInvalidRequest, Code: runnerapi.CodeNotFound,
			Message: fmt.Sprintf("no state of this partition backs prefix %s", digest)})
		return
	}
	defer e.close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(e.size, 10))
	w.Header().Set(runnerapi.HeaderStateTokens, strconv.Itoa(e.tokens))
	w.WriteHeader(http.StatusOK)
	start := time.Now()
	n, err := io.Copy(w, e.body)
	if err != nil {
		cs.log.Info("Exporting a prompt cache state stopped", "digest", digest, "bytes", n, "of", e.size, "error", err.Error())
		return
	}
	cs.pc.exports.Add(1)
	cs.log.V(1).Info("Exported a prompt cache state", "digest", digest, "tokens", e.tokens, "bytes", n,
		"took", time.Since(start).Round(time.Millisecond))
}

// handleImportState is POST /cache/states: one entry in the body, the partition
// (runnerapi.HeaderCachePartition) it must belong to, and the digests
// (runnerapi.HeaderPrefixDigests) it backs.
func (cs *cacheStore) handleImportState(w http.ResponseWriter, r *http.Request) {
	if _, herr := cs.run.engine(); herr != nil {
		writeError(w, herr)
		return
	}
	start := time.Now()
	if !cs.pc.active() {
		writeJSON(w, http.StatusConflict, runnerapi.PeerStateResult{Reason: runnerapi.PeerMissDisabled, Detail: cacheOffMessage(cs.off)})
		return
	}
	partition := r.Header.Get(runnerapi.HeaderCachePartition)
	status, res := cs.pc.importState(r.Body, partition, promptcache.ParseDigests(r.Header.Get(runnerapi.HeaderPrefixDigests)), cs.slotCtx)
	res.Millis = time.Since(start).Milliseconds()
	if res.Imported {
		cs.log.V(1).Info("Imported a peer's prompt cache state", "tokens", res.Tokens, "bytes", res.Bytes, "ms", res.Millis)
	} else {
		cs.pc.importMisses.Add(1)
		cs.log.Info("Refused a peer's prompt cache state", "reason", res.Reason, "detail", res.Detail, "partitioned", partition != "")
	}
	writeJSON(w, status, res)
}
