package e2e

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/http"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// TestAttackForgedStateCells: a compromised Mac seals, for a prefix it was sent, the
// real state of that prefix with one cell's position made negative (the entry's
// checksums, identity and key are all its to compute, so the import takes it).
// llama.cpp restored such a cell as written, and the next decode ended the runner on
// an assertion of its KV cache (found by FuzzImportedState): every later request of
// the model failed until the agent restarted it. The runner now checks the cells
// before the restore: the request prefills in full, answers as a cold runner does, and
// the runner lives.
func TestAttackForgedStateCells(t *testing.T) {
	m := specModel(t, "llama31", testassets.Llama31Spec)
	const digest, partition = "00000000000000e3", "team-a"
	a := startReady(t, m, peerFlags("")...)
	msgs := peerPrompt(t, a)
	coldReply, entry, tokens := savedState(t, a, msgs, partition, digest)
	hdr, payload := entry[:promptcache.EntryHeaderSize], entry[promptcache.EntryHeaderSize:]
	prefix := payload[:16+4*tokens]
	state := bytes.Clone(payload[len(prefix):])
	// The state: its streams' count, then each stream's cell count and cells (position,
	// count of sequences, their ids). The slot's stream is the first with cells.
	at := 4
	for binary.LittleEndian.Uint32(state[at:]) == 0 {
		at += 4
	}
	for _, pos := range []int32{-5, -1} { // -1 is an empty cell's, which a written cell never is
		t.Run(fmt.Sprintf("at %d", pos), func(t *testing.T) {
			forged := bytes.Clone(state)
			binary.LittleEndian.PutUint32(forged[at+4:], uint32(pos))
			b := startReady(t, m, peerFlags("")...)
			if code, res := importState(t, b, sealed(hdr, prefix, forged), partition, digest); code != http.StatusOK || !res.Imported {
				t.Fatalf("import of the forged state: %d %+v, want it taken (its checks are the forger's)", code, res)
			}
			part := map[string]string{runnerapi.HeaderCachePartition: partition}
			for i := range 2 {
				reply, u := chatWith(t, b, part, msgs, 16)
				if cachedTokens(u) != 0 || reply != coldReply {
					t.Errorf("request %d after a cell at %d: %d tokens restored, %q; want 0 and %q", i, pos, cachedTokens(u), reply, coldReply)
				}
				clearCache(t, b) // the slot holds the request's own state
				b.checkAlive()
			}
		})
	}
}
