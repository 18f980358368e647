package models_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// TestBrokenRestoreFailsTheRow proves that the state rows can fail: prompt's state,
// exported from one runner of the tiny llama, has the sign of its first layer's keys
// flipped and is resealed with the checksums a forger computes, so that a second
// runner takes it and restores it as it would any state. The row's comparison
// (restoredDiff, which TestPeerStatePerFamily asserts) must then report the answer
// that differs from the full prefill's.
func TestBrokenRestoreFailsTheRow(t *testing.T) {
	eachFamily(t, func(t *testing.T, bin string, m tinyModel) {
		if m.family != ggufsynth.Llama {
			t.Skip("one family proves the comparison")
		}
		a := startRunner(t, bin, m.path, peerFlags...)
		cold, _ := peerChat(a, prompt, true)
		entry, tokens := exportSaved(t, a)
		a.stop()
		b := startRunner(t, bin, m.path, peerFlags...)
		code, res := peerImport(b, brokenKeys(t, entry, tokens))
		if code != 200 || !res.Imported {
			t.Fatalf("the resealed state: %d %+v, want it taken", code, res)
		}
		got, cached := peerChat(b, prompt, true)
		if cached <= 0 {
			t.Fatalf("the broken state was not restored (cached %d): nothing was proven", cached)
		}
		diff := restoredDiff(got, cold, cached, tokens)
		if diff == "" {
			t.Errorf("after restoring keys of flipped sign the answer is the full prefill's %q: the row cannot fail", cold)
		}
		t.Logf("broken restore: %s", diff)
	})
}

// brokenKeys is entry (tokens long) with the sign of every key of the first layer
// flipped, resealed: llama.cpp writes a sequence's state as its cell table, then
// v_trans and the layer count (two uint32), then per layer the keys' type (int32),
// row size (uint64) and rows (F16 here).
func brokenKeys(t *testing.T, entry []byte, tokens int) []byte {
	t.Helper()
	hdr, prefix, state := peerEntryParts(entry, tokens)
	tables := cellTables(state, tokens)
	if len(tables) == 0 {
		t.Fatalf("no cell table of %d tokens in the state's %d bytes", tokens, len(state))
	}
	cells := int(binary.LittleEndian.Uint32(state[tables[0]:]))
	at := tables[0] + 4 + 12*cells + 8 + 4
	row := int(binary.LittleEndian.Uint64(state[at:]))
	at += 8
	if row <= 0 || row%2 != 0 || at+cells*row > len(state) {
		t.Fatalf("key rows of %d bytes at %d: not the layout expected in a state of %d bytes", row, at, len(state))
	}
	for i := at + 1; i < at+cells*row; i += 2 { // the high byte of each F16 key
		state[i] ^= 0x80
	}
	out := peerSeal(hdr, prefix, state)
	if bytes.Equal(out, entry) {
		t.Fatalf("the broken entry equals the original (%d bytes)", len(entry))
	}
	return out
}
