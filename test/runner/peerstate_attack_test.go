package e2e

import (
	"bytes"
	"encoding/binary"
	"net/http"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// TestAttackForgedStateCells: a compromised Mac seals, for a prefix it was sent, the
// real state of that prefix with one cell's position forged (the entry's checksums,
// identity and key are all its to compute, so the import takes it). llama.cpp
// restored such cells as written: a negative position ended the runner on an
// assertion of its KV cache at the next decode (every later request of the model
// failed until the agent restarted it), a repeated one failed that request with a 500
// (both found by FuzzImportedState). The runner now checks the cells before the
// restore: the request prefills in full, answers as a cold runner does, and the
// runner lives.
func TestAttackForgedStateCells(t *testing.T) {
	m := specModel(t, "llama31", testassets.Llama31Spec)
	const digest, partition = "00000000000000e3", "team-a"
	a := startReady(t, m, peerFlags("")...)
	msgs := peerPrompt(t, a)
	coldReply, entry, tokens := savedState(t, a, msgs, partition, digest)
	hdr, prefix, state := entryParts(entry, tokens)
	// The state: its streams' count, then each stream's cell count and cells (position,
	// count of sequences, their ids). The slot's stream is the first with cells.
	at := 4
	for binary.LittleEndian.Uint32(state[at:]) == 0 {
		at += 4
	}
	for _, tc := range []struct {
		name string
		cell int   // the cell whose position is forged
		pos  int32 // its position
	}{
		{"a cell at -5", 0, -5},
		{"a cell at -1", 0, -1}, // an empty cell's, which a written cell never is
		{"a position repeated", 1, 0},
		{"a position past the cells", 1, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			forged := bytes.Clone(state)
			binary.LittleEndian.PutUint32(forged[at+4+12*tc.cell:], uint32(tc.pos))
			b := startReady(t, m, peerFlags("")...)
			if code, res := importState(t, b, sealed(hdr, prefix, forged), partition, digest); code != http.StatusOK || !res.Imported {
				t.Fatalf("import of the forged state: %d %+v, want it taken (its checks are the forger's)", code, res)
			}
			part := map[string]string{runnerapi.HeaderCachePartition: partition}
			for i := range 2 {
				reply, u := chatWith(t, b, part, msgs, 16)
				if cachedTokens(u) != 0 || reply != coldReply {
					t.Errorf("request %d: %d tokens restored, %q; want 0 and %q", i, cachedTokens(u), reply, coldReply)
				}
				clearCache(t, b) // the slot holds the request's own state
				b.checkAlive()
			}
		})
	}
}
