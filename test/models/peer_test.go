package models_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
)

// peerDigest and peerPartition are the prefix digest and partition the peer tests
// export and import prompt's state under.
const peerDigest, peerPartition = "00000000000000a1", "team-a"

// peerFlags are the flags of a peer test's runner: one slot, 32-token blocks and a
// hot tier.
var peerFlags = []string{"--parallel", "1", "--prompt-cache-block", "32", "--prompt-cache-hot-bytes", fmt.Sprint(64 << 20)}

// TestPeerStatePerFamily exports prompt's state from one runner of each family's tiny
// model and imports it into a second: the second continues as the first's full
// prefill did. An entry with a flipped byte (in its state, at its end where a
// sliding-window model keeps its window's cache, in a token) is refused as corrupt;
// one resealed with a forged cell position is taken but never restored. A family
// whose prompt cache is off answers both endpoints 409 with its reason.
func TestPeerStatePerFamily(t *testing.T) {
	eachFamily(t, func(t *testing.T, bin string, m tinyModel) {
		f, spec, path := m.family, m.spec, m.path
		a := startRunner(t, bin, path, peerFlags...)
		cold, cached := peerChat(a, prompt, true)
		if cached != 0 {
			t.Fatalf("the first request restored %d tokens, want a full prefill", cached)
		}
		if o, _ := peerChat(a, other, false); o == cold {
			t.Fatalf("the answers to two prompts are alike (%q): a comparison could not fail", o)
		}
		if len(pathsOff[f]) > 0 {
			checkPeerOff(t, a, pathsOff[f][0].Reason)
			return
		}
		entry, tokens := exportSaved(t, a)
		a.stop()
		b := startRunner(t, bin, path, peerFlags...)
		checkPeerImport(t, b, entry, tokens, cold)
		checkForgedEntries(t, b, cold, forgedEntries(t, entry, tokens, spec.Window != nil))
		t.Logf("%s: %d tokens in %d bytes; answer %q", f, tokens, len(entry), cold)
	})
}

// TestAttackForgedWindowCells: a peer Mac (or a crafted file in the SSD tier) hands the
// runner of a sliding-window model (gpt-oss, gemma3) prompt's state with a cell of its
// window's cache moved to position -5, resealed with checksums the forger computes.
// Until a49d001 the runner checked only the first cache's cells: it restored the state
// and died at its next decode on a llama.cpp assertion, so one peer could end any
// sliding-window model's runner. Now the import is taken, never restored, and the
// runner answers as a full prefill.
func TestAttackForgedWindowCells(t *testing.T) {
	eachFamily(t, func(t *testing.T, bin string, m tinyModel) {
		if m.spec.Window == nil {
			t.Skipf("%s has no sliding-window layers", m.family)
		}
		a := startRunner(t, bin, m.path, peerFlags...)
		cold, _ := peerChat(a, prompt, true)
		entry, tokens := exportSaved(t, a)
		a.stop()
		b := startRunner(t, bin, m.path, peerFlags...)
		forged := forgedEntries(t, entry, tokens, true)
		checkForgedEntries(t, b, cold, forged[len(forged)-1:])
	})
}

// exportSaved exports prompt's state from r once r has saved it; it returns the entry
// and its token count.
func exportSaved(t *testing.T, r *modelRunner) (entry []byte, tokens int) {
	t.Helper()
	waitFor(t, "the state to back the digest", 30*time.Second, func() bool {
		var code int
		code, entry, tokens = peerExport(r)
		return code == http.StatusOK
	})
	return entry, tokens
}

// checkPeerOff checks that a runner whose prompt cache is off for reason answers an
// export and an import 409, naming it.
func checkPeerOff(t *testing.T, r *modelRunner, reason string) {
	t.Helper()
	code, body, _ := peerExport(r)
	var e runnerapi.ErrorBody
	if code != http.StatusConflict || json.Unmarshal(body, &e) != nil || e.Error.Code != runnerapi.PeerMissDisabled ||
		!strings.Contains(e.Error.Message, reason) {
		t.Errorf("export: %d %q, want 409 naming %q", code, body, reason)
	}
	code, res := peerImport(r, []byte("not an entry"))
	if code != http.StatusConflict || res.Imported || res.Reason != runnerapi.PeerMissDisabled || !strings.Contains(res.Detail, reason) {
		t.Errorf("import: %d %+v, want 409 %s naming %q", code, res, runnerapi.PeerMissDisabled, reason)
	}
}

// checkPeerImport imports entry (tokens long) into r and checks that prompt then
// restores it and answers cold.
func checkPeerImport(t *testing.T, r *modelRunner, entry []byte, tokens int, cold string) {
	t.Helper()
	code, res := peerImport(r, entry)
	if code != http.StatusOK || !res.Imported || res.Tokens != tokens || res.Bytes != int64(len(entry)) {
		t.Fatalf("import: %d %+v, want imported, %d tokens, %d bytes", code, res, tokens, len(entry))
	}
	got, cached := peerChat(r, prompt, true)
	if diff := restoredDiff(got, cold, cached, tokens); diff != "" {
		t.Errorf("after the import: %s", diff)
	}
	if pc := r.status().PromptCache; pc == nil || pc.PeerImports != 1 || pc.Restores != 1 {
		t.Errorf("prompt cache after the import %+v: want 1 import, 1 restore", pc)
	}
	peerClear(r)
}

// restoredDiff is how an answer got, with cached tokens restored from a state of
// tokens, differs from the full prefill's answer cold ("" when it does not).
func restoredDiff(got, cold string, cached, tokens int) string {
	if cached <= 0 || cached > tokens || got != cold {
		return fmt.Sprintf("%d tokens restored, %q; want up to the state's %d and the full prefill's %q", cached, got, tokens, cold)
	}
	return ""
}

// forgedEntry is an altered entry: refused as corrupt, or (resealed) taken and never
// restored.
type forgedEntry struct {
	name     string
	entry    []byte
	resealed bool
}

// checkForgedEntries imports each forged entry into r: refused as corrupt, or taken
// when resealed; prompt then answers cold without a restore, and the runner lives.
func checkForgedEntries(t *testing.T, r *modelRunner, cold string, forged []forgedEntry) {
	t.Helper()
	for _, c := range forged {
		code, res := peerImport(r, c.entry)
		switch {
		case c.resealed && (code != http.StatusOK || !res.Imported):
			t.Errorf("%s: %d %+v, want it taken (its checksums are the forger's)", c.name, code, res)
		case !c.resealed && (code != http.StatusUnprocessableEntity || res.Imported || res.Reason != runnerapi.PeerMissCorrupt || res.Detail == ""):
			t.Errorf("%s: %d %+v, want 422 %s with a detail", c.name, code, res, runnerapi.PeerMissCorrupt)
		}
		before := r.status().PromptCache
		got, cached := peerChat(r, prompt, true)
		if cached != 0 || got != cold {
			t.Errorf("%s: the next request restored %d tokens and said %q; want 0 and %q", c.name, cached, got, cold)
		}
		if after := r.status().PromptCache; before == nil || after == nil || after.Restores != before.Restores {
			t.Errorf("%s: prompt cache %+v then %+v: want no restore", c.name, before, after)
		}
		peerClear(r)
	}
}

// forgedEntries are entry's altered copies: a flipped byte in its state's middle, in
// its last bytes (where a sliding-window model keeps its window's cache, written after
// the full attention's), in a token; resealed, a forged position in the first cell
// table and, for a sliding-window model, in the window's.
func forgedEntries(t *testing.T, entry []byte, tokens int, window bool) []forgedEntry {
	t.Helper()
	hdr, prefix, state := peerEntryParts(entry, tokens)
	flipped := func(i int) []byte {
		e := bytes.Clone(entry)
		e[i] ^= 0x10
		return e
	}
	at := len(hdr) + len(prefix)
	out := []forgedEntry{
		{name: "a flipped state byte", entry: flipped(at + len(state)/2)},
		{name: "a flipped last byte", entry: flipped(len(entry) - 3)},
		{name: "a flipped token", entry: flipped(len(hdr) + 16 + 4*(tokens/2))},
	}
	tables := cellTables(state, tokens)
	if len(tables) == 0 {
		t.Fatalf("no cell table of %d tokens found in the state's %d bytes", tokens, len(state))
	}
	forge := func(table int) []byte {
		st := bytes.Clone(state)
		binary.LittleEndian.PutUint32(st[table+4:], uint32(0xfffffffb)) // position -5
		return peerSeal(hdr, prefix, st)
	}
	out = append(out, forgedEntry{name: "a forged position in the first cell table", entry: forge(tables[0]), resealed: true})
	if window {
		if len(tables) < 2 {
			t.Fatalf("a sliding-window model's state with %d cell tables (at %v), want the window's after the first", len(tables), tables)
		}
		out = append(out, forgedEntry{name: "a forged position in the window's cell table", entry: forge(tables[len(tables)-1]), resealed: true})
	}
	return out
}

// cellTables are the offsets in state of its KV caches' cell tables: a stream count of
// 1, then a cell count of at most tokens, then that many cells each of one sequence
// at distinct positions below tokens (llama.cpp's sequence state of an attention KV
// cache). A table is sought only after the previous one ends.
func cellTables(state []byte, tokens int) []int {
	var out []int
	for o := 4; o+4 <= len(state); o++ {
		if binary.LittleEndian.Uint32(state[o-4:]) != 1 {
			continue
		}
		if n := cellTable(state[o:], tokens); n > 0 {
			out = append(out, o)
			o += 4 + 12*n - 1
		}
	}
	return out
}

// cellTable is the count of cells of the table that b starts with, 0 when it does not
// start with one.
func cellTable(b []byte, tokens int) int {
	n := int(binary.LittleEndian.Uint32(b))
	if n == 0 || n > tokens || len(b) < 4+12*n {
		return 0
	}
	seen := make([]bool, tokens)
	for i := range n {
		pos, seqs := binary.LittleEndian.Uint32(b[4+12*i:]), binary.LittleEndian.Uint32(b[8+12*i:])
		if seqs != 1 || pos >= uint32(tokens) || seen[pos] {
			return 0
		}
		seen[pos] = true
	}
	return n
}

// peerEntryParts splits an entry of a state of tokens tokens into its header, its
// payload's start (the blob's header and tokens) and the engine's state.
func peerEntryParts(entry []byte, tokens int) (hdr, prefix, state []byte) {
	hdr, payload := entry[:promptcache.EntryHeaderSize], entry[promptcache.EntryHeaderSize:]
	prefix = payload[:16+4*tokens]
	return hdr, prefix, bytes.Clone(payload[len(prefix):])
}

// peerSeal is an entry of header hdr and payload prefix and state, with the lengths
// and checksums a peer that forged it computes.
func peerSeal(hdr, prefix, state []byte) []byte {
	table := crc32.MakeTable(crc32.Castagnoli)
	p := append(bytes.Clone(prefix), state...)
	h := bytes.Clone(hdr)
	binary.LittleEndian.PutUint64(h[72:], uint64(len(p)))
	binary.LittleEndian.PutUint32(h[80:], crc32.Checksum(p, table))
	binary.LittleEndian.PutUint32(h[92:], crc32.Checksum(h[:92], table))
	return append(h, p...)
}

// peerRequest sends method path with body and the peer tests' partition and digest.
func peerRequest(r *modelRunner, method, path string, body []byte) (int, http.Header, []byte) {
	r.t.Helper()
	req, err := http.NewRequest(method, r.base+path, bytes.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set(runnerapi.HeaderCachePartition, peerPartition)
	req.Header.Set(runnerapi.HeaderPrefixDigests, peerDigest)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header, out
}

// peerExport is GET /cache/states/{peerDigest}: the status, the body and the state's
// tokens.
func peerExport(r *modelRunner) (int, []byte, int) {
	code, h, body := peerRequest(r, http.MethodGet, "/cache/states/"+peerDigest, nil)
	tokens, _ := strconv.Atoi(h.Get(runnerapi.HeaderStateTokens))
	return code, body, tokens
}

// peerImport is POST /cache/states of entry: the status and the answer.
func peerImport(r *modelRunner, entry []byte) (int, runnerapi.PeerStateResult) {
	code, _, b := peerRequest(r, http.MethodPost, "/cache/states", entry)
	var res runnerapi.PeerStateResult
	if err := json.Unmarshal(b, &res); err != nil {
		r.t.Fatalf("POST /cache/states: %d %q: %v", code, b, err)
	}
	return code, res
}

// peerClear empties r's slot and tiers.
func peerClear(r *modelRunner) {
	if code, _, b := peerRequest(r, http.MethodPost, "/cache/clear", nil); code != http.StatusOK {
		r.t.Fatalf("cache clear: %d %q", code, b)
	}
}

// peerChat is the bytes of r's greedy answer to text in the peer tests' partition
// (and with their digest when digest), and the prompt tokens it restored.
func peerChat(r *modelRunner, text string, digest bool) (string, int) {
	r.t.Helper()
	h := map[string]string{runnerapi.HeaderCachePartition: peerPartition}
	if digest {
		h[runnerapi.HeaderPrefixDigests] = peerDigest
	}
	c := r.greedyChat(text, answerTokens, h)
	var out []byte
	for _, lp := range c.Choices[0].Logprobs.Content {
		for _, b := range lp.Bytes {
			out = append(out, byte(b))
		}
	}
	cached := 0
	if d := c.Usage.PromptTokensDetails; d != nil {
		cached = d.CachedTokens
	}
	return string(out), cached
}

// greedyChat is r's greedy answer to text, at most maxTokens with their logprobs,
// sent with headers.
func (r *modelRunner) greedyChat(text string, maxTokens int, headers map[string]string) runnerapi.ChatCompletion {
	r.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "test", "temperature": 0, "max_tokens": maxTokens, "logprobs": true,
		"messages": []map[string]string{{"role": "user", "content": text}}})
	req, err := http.NewRequest(http.MethodPost, r.base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	var c runnerapi.ChatCompletion
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != http.StatusOK || len(c.Choices) != 1 ||
		c.Choices[0].Logprobs == nil || c.Usage == nil {
		r.t.Fatalf("chat: %d %+v %v", resp.StatusCode, c, err)
	}
	return c
}
