package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// peerBlock is the prompt cache block of the peer state tests.
const peerBlock = 32

// peerFlags are the prompt cache flags of a peer state test's runner: one slot, a hot
// tier, and an SSD tier in dir when dir is not empty.
func peerFlags(dir string, extra ...string) []string {
	f := []string{"--parallel", "1", "--prompt-cache-block", strconv.Itoa(peerBlock), "--prompt-cache-hot-bytes", strconv.Itoa(1 << 30)}
	if dir != "" {
		f = append(f, "--prompt-cache-dir", dir)
	}
	return append(f, extra...)
}

// peerPrompt is a chat of more than 1024 tokens on the model with a real vocabulary.
func peerPrompt(t *testing.T, r *runner) []chatMsg {
	t.Helper()
	msgs := []chatMsg{
		{"role": "system", "content": "You are a careful assistant. " + words(26, 800)},
		{"role": "user", "content": "Summarize the " + words(27, 250)},
	}
	if n := len(tokensOf(t, r, msgs)); n < 1024 {
		t.Fatalf("the prompt is %d tokens, want 1024 or more", n)
	}
	return msgs
}

// stateRequest sends a request to a peer state endpoint with the headers that are not
// empty and returns the answer's status, header and body.
func stateRequest(t testing.TB, r *runner, method, path string, body []byte, headers map[string]string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, r.base+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	for k, v := range headers {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading: %v", method, path, err)
	}
	return resp.StatusCode, resp.Header, out
}

// exportState is GET /cache/states/{digest} in partition: the status, the body and the
// state's tokens (X-Macfleet-State-Tokens).
func exportState(t testing.TB, r *runner, digest, partition string) (int, []byte, int) {
	t.Helper()
	code, h, body := stateRequest(t, r, http.MethodGet, "/cache/states/"+digest, nil,
		map[string]string{runnerapi.HeaderCachePartition: partition})
	tokens, _ := strconv.Atoi(h.Get(runnerapi.HeaderStateTokens))
	return code, body, tokens
}

// importState is POST /cache/states of entry in partition with digests (none when
// empty): the status and the answer.
func importState(t testing.TB, r *runner, entry []byte, partition, digests string) (int, runnerapi.PeerStateResult) {
	t.Helper()
	code, _, b := stateRequest(t, r, http.MethodPost, "/cache/states", entry,
		map[string]string{runnerapi.HeaderCachePartition: partition, runnerapi.HeaderPrefixDigests: digests})
	var res runnerapi.PeerStateResult
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("POST /cache/states: %d %q: %v", code, b, err)
	}
	return code, res
}

// savedState prefills msgs on r in partition with digest, checks the answer came cold,
// and returns it with the state exported once r's tiers hold it.
func savedState(t testing.TB, r *runner, msgs []chatMsg, partition, digest string) (reply string, entry []byte, tokens int) {
	t.Helper()
	headers := map[string]string{runnerapi.HeaderCachePartition: partition, runnerapi.HeaderPrefixDigests: digest}
	reply, u := chatWith(t, r, headers, msgs, 16)
	if cachedTokens(u) != 0 {
		t.Fatalf("the first request: %d cached tokens, want 0", cachedTokens(u))
	}
	waitFor(t, 30*time.Second, "the state to back the digest", func() bool {
		var code int
		code, entry, tokens = exportState(t, r, digest, partition)
		return code == http.StatusOK
	})
	if tokens < u.PromptTokens || len(entry) <= promptcache.EntryHeaderSize+4*tokens {
		t.Fatalf("exported %d bytes holding %d tokens for a prompt of %d", len(entry), tokens, u.PromptTokens)
	}
	return reply, entry, tokens
}

// TestPeerStateRestoresLikeAPrefill: runner A prefills a prompt of more than 1 k tokens
// and saves its state; exported from A (hot tier, and byte for byte the same from its
// SSD tier) and imported into a fresh runner B of the same model and settings, it
// spares B the prompt's prefill, and B answers token for token what the cold A did;
// another conversation with the same system prompt restores the shared blocks.
func TestPeerStateRestoresLikeAPrefill(t *testing.T) {
	m := specModel(t, "llama31", testassets.Llama31Spec)
	const digest, partition = "00000000000000d1", "team-a"
	a := startReady(t, m, peerFlags(t.TempDir())...)
	msgs := peerPrompt(t, a)
	coldReply, hotEntry, tokens := savedState(t, a, msgs, partition, digest)

	waitFor(t, 30*time.Second, "A's SSD tier to persist the state", func() bool {
		pc := promptCacheStatus(t, a)
		return pc.SavesPending == 0 && pc.SSD != nil && pc.SSD.Queued == 0
	})
	clearCache(t, a)
	code, ssdEntry, ssdTokens := exportState(t, a, digest, partition)
	if code != http.StatusOK || ssdTokens != tokens || !bytes.Equal(ssdEntry, hotEntry) {
		t.Fatalf("export from the SSD tier: %d, %d bytes of %d tokens; the hot tier's was %d bytes of %d tokens",
			code, len(ssdEntry), ssdTokens, len(hotEntry), tokens)
	}
	if pc := promptCacheStatus(t, a); pc.PeerExports != 2 {
		t.Errorf("A counts %d exports, want 2", pc.PeerExports)
	}

	b := startReady(t, m, peerFlags(t.TempDir())...)
	code, res := importState(t, b, ssdEntry, partition, digest)
	if code != http.StatusOK || !res.Imported || res.Tokens != tokens || res.Bytes != int64(len(ssdEntry)) {
		t.Fatalf("import: %d %+v, want imported, %d tokens, %d bytes", code, res, tokens, len(ssdEntry))
	}
	// Importing it again is fine, and stores nothing twice.
	if code, res := importState(t, b, ssdEntry, partition, digest); code != http.StatusOK || !res.Imported {
		t.Fatalf("second import: %d %+v", code, res)
	}
	ev := prefixes(t, b, "", 0, 0)
	if len(ev.Events) != 1 || ev.Events[0].Digest != digest || ev.Events[0].Tier != string(promptcache.TierHot) {
		t.Errorf("B's prefix table after the import: %+v, want %s held hot", ev.Events, digest)
	}
	// Another conversation with the same system prompt restores the blocks they share:
	// the import put references under the state's shallower blocks.
	part := map[string]string{runnerapi.HeaderCachePartition: partition}
	other := []chatMsg{msgs[0], {"role": "user", "content": "Describe the " + words(28, 40)}}
	cold := startReady(t, m)
	otherCold, _ := chatWith(t, cold, nil, other, 16)
	cold.stop()
	shared := sharedTokens(tokensOf(t, b, msgs), tokensOf(t, b, other))
	otherReply, u := chatWith(t, b, part, other, 16)
	if got := cachedTokens(u); got < shared/peerBlock*peerBlock || got > shared {
		t.Errorf("B restored %d tokens of a conversation sharing %d with the import, want at least %d", got, shared, shared/peerBlock*peerBlock)
	}
	if otherReply != otherCold {
		t.Errorf("B says %q to the other conversation, a cold runner %q", otherReply, otherCold)
	}

	promptTokens := len(tokensOf(t, b, msgs))
	reply, u := chatWith(t, b, part, msgs, 16)
	if got := cachedTokens(u); got < promptTokens-peerBlock || got >= promptTokens {
		t.Errorf("B restored %d of the prompt's %d tokens, want all but the last (at least %d)", got, promptTokens, promptTokens-peerBlock)
	}
	if reply != coldReply {
		t.Errorf("B after the import says %q, the cold A said %q", reply, coldReply)
	}
	pc := promptCacheStatus(t, b)
	if pc.PeerImports != 2 || pc.Restores != 2 || pc.Hot.Entries == 0 {
		t.Errorf("B's prompt cache: %d imports, %d restores, %d hot entries; want 2, 2, some", pc.PeerImports, pc.Restores, pc.Hot.Entries)
	}
	waitFor(t, 30*time.Second, "B's SSD tier to persist the import", func() bool {
		pc := promptCacheStatus(t, b)
		return pc.SavesPending == 0 && pc.SSD != nil && pc.SSD.Queued == 0 && pc.SSD.SavesPersisted > 0
	})
	if pc := promptCacheStatus(t, b); pc.SSD.Duplicates == 0 {
		t.Errorf("the second import was written again: %+v", *pc.SSD)
	}
}

// TestPeerStateRejects: an entry with a flipped payload or header byte, truncated, of
// another partition, or for a runner of another slot count, a shorter context or
// another model file keeps nothing (the next request prefills in full and answers as a
// cold runner); no state is exported to another partition.
func TestPeerStateRejects(t *testing.T) {
	m := specModel(t, "llama31", testassets.Llama31Spec)
	const digest, partition = "00000000000000d2", "team-a"
	a := startReady(t, m, peerFlags("")...)
	msgs := peerPrompt(t, a)
	coldReply, entry, _ := savedState(t, a, msgs, partition, digest)

	for _, p := range []string{"", "team-b"} {
		if code, body, _ := exportState(t, a, digest, p); code != http.StatusNotFound {
			t.Errorf("export to partition %q: %d %q, want 404", p, code, body)
		}
	}
	if code, _, _ := exportState(t, a, "00000000000000ff", partition); code != http.StatusNotFound {
		t.Errorf("export of an unknown digest: %d, want 404", code)
	}

	flipped := func(i int) []byte {
		e := bytes.Clone(entry)
		e[i] ^= 0x10
		return e
	}
	otherModel := filepath.Join(t.TempDir(), "copy.gguf")
	if data, err := os.ReadFile(m); err != nil || os.WriteFile(otherModel, data, 0o600) != nil {
		t.Fatalf("copying the model: %v", err)
	}
	b := startReady(t, m, peerFlags("")...)
	otherSlots := startReady(t, m, peerFlags("", "--parallel", "2")...)
	smallCtx := startReady(t, m, peerFlags("", "--ctx", "1024")...)
	otherFile := startReady(t, otherModel, peerFlags("")...)
	cases := []struct {
		name, reason, partition string
		r                       *runner
		entry                   []byte
	}{
		{"a flipped payload byte", runnerapi.PeerMissCorrupt, partition, b, flipped(len(entry) - 100)},
		{"a flipped token", runnerapi.PeerMissCorrupt, partition, b, flipped(promptcache.EntryHeaderSize + 40)},
		{"a flipped header byte", runnerapi.PeerMissCorrupt, partition, b, flipped(50)},
		{"a truncated entry", runnerapi.PeerMissCorrupt, partition, b, entry[:len(entry)-1]},
		{"another partition", runnerapi.PeerMissKey, "team-b", b, entry},
		{"the shared partition", runnerapi.PeerMissKey, "", b, entry},
		{"another slot count", runnerapi.PeerMissIncompatible, partition, otherSlots, entry},
		{"a context shorter than the state", runnerapi.PeerMissIncompatible, partition, smallCtx, entry},
		{"another model file", runnerapi.PeerMissIncompatible, partition, otherFile, entry},
	}
	for _, c := range cases {
		code, res := importState(t, c.r, c.entry, c.partition, digest)
		if code != http.StatusUnprocessableEntity || res.Imported || res.Reason != c.reason || res.Detail == "" {
			t.Errorf("%s: %d %+v, want 422 %s with a detail", c.name, code, res, c.reason)
		}
		if ev := prefixes(t, c.r, "", 0, 0); len(ev.Events) != 0 {
			t.Errorf("%s: the prefix table learnt %+v", c.name, ev.Events)
		}
		if pc := promptCacheStatus(t, c.r); pc.Hot.Entries != 0 || pc.PeerImports != 0 {
			t.Errorf("%s: the runner keeps %d hot entries after %d imports", c.name, pc.Hot.Entries, pc.PeerImports)
		}
		if c.r == smallCtx {
			continue // the prompt does not fit its context
		}
		reply, u := chatWith(t, c.r, map[string]string{runnerapi.HeaderCachePartition: c.partition}, msgs, 16)
		if cachedTokens(u) != 0 || reply != coldReply {
			t.Errorf("%s: the next request restored %d tokens and said %q; want 0 and %q", c.name, cachedTokens(u), reply, coldReply)
		}
		clearCache(t, c.r) // the slot and the hot tier hold that request's own state
	}
	if pc := promptCacheStatus(t, b); pc.PeerImports != 0 || pc.PeerImportMisses != 6 || pc.Restores != 0 {
		t.Errorf("B's prompt cache: %d imports, %d refused, %d restores; want 0, 6, 0", pc.PeerImports, pc.PeerImportMisses, pc.Restores)
	}

	off := startReady(t, m, "--parallel", "1")
	if code, res := importState(t, off, entry, partition, ""); code != http.StatusConflict || res.Reason != runnerapi.PeerMissDisabled {
		t.Errorf("import into a runner without a prompt cache: %d %+v, want 409 %s", code, res, runnerapi.PeerMissDisabled)
	}
	if code, body, _ := exportState(t, off, digest, partition); code != http.StatusConflict {
		t.Errorf("export from a runner without a prompt cache: %d %q, want 409", code, body)
	}
	if code, body, _ := exportState(t, a, "not-a-digest", partition); code != http.StatusBadRequest {
		t.Errorf("export of a malformed digest: %d %q, want 400", code, body)
	}
}
