package e2e

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"net/http"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// FuzzImportedState imports into a real runner a prompt state whose llama.cpp
// sequence state (the bytes after the blob's tokens) the fuzzer makes, sealed as a
// peer that computes the checksums would seal it (the same tokens, key and identity
// as a real state), then asks for the prompt it backs, which restores it. Whatever
// the bytes, the import is accepted or refused as corrupt (200 or 422), and the
// runner then answers the prompt (a state llama.cpp refuses is prefilled instead) and
// lives. The seeds are the real state, cut short, zeroed in part, and with its cell
// count claimed huge.
func FuzzImportedState(f *testing.F) {
	m := specModel(f, "llama31", testassets.Llama31Spec)
	const digest, partition = "00000000000000f1", "team-a"
	r := startReady(f, m, peerFlags("")...)
	msgs := []chatMsg{{"role": "user", "content": "Summarize the " + words(31, 120)}}
	_, entry, tokens := savedState(f, r, msgs, partition, digest)
	hdr, prefix, state := entryParts(entry, tokens)
	f.Add(bytes.Clone(state))
	f.Add(bytes.Clone(state[:len(state)/2]))
	zeroed := bytes.Clone(state)
	clear(zeroed[:min(64, len(zeroed))])
	f.Add(zeroed)
	huge := bytes.Clone(state)
	for i := 0; i+4 <= min(len(huge), 32); i += 4 {
		binary.LittleEndian.PutUint32(huge[i:], 0x7fffffff)
	}
	f.Add(huge)
	part := map[string]string{runnerapi.HeaderCachePartition: partition}
	f.Fuzz(func(t *testing.T, st []byte) {
		r := &runner{t: t, cmd: r.cmd, base: r.base, client: r.client, stderr: r.stderr, exited: r.exited} // its failures are t's
		r.checkAlive()
		defer r.checkAlive()
		clearCache(t, r)
		code, res := importState(t, r, sealed(hdr, prefix, st), partition, digest)
		if code != http.StatusOK && code != http.StatusUnprocessableEntity {
			t.Fatalf("import: %d %+v, want 200 or 422", code, res)
		}
		// chatWith fails the input unless the runner answers 200.
		_, u := chatWith(t, r, part, msgs, 1)
		if bytes.Equal(st, state) && (code != http.StatusOK || cachedTokens(u) == 0) {
			t.Fatalf("the real state: import %d %+v, %d tokens restored; want it imported and restored", code, res, cachedTokens(u))
		}
	})
}

// entryParts are an exported entry's parts: its header, its payload's prefix (the
// blob's tokens) and llama.cpp's state after it, a copy.
func entryParts(entry []byte, tokens int) (hdr, prefix, state []byte) {
	hdr, payload := entry[:promptcache.EntryHeaderSize], entry[promptcache.EntryHeaderSize:]
	prefix = payload[:16+4*tokens]
	return hdr, prefix, bytes.Clone(payload[len(prefix):])
}

// sealed is an entry of header hdr and payload prefix (the blob's tokens) and st (its
// llama.cpp state), its lengths and checksums computed as a peer computes them.
func sealed(hdr, prefix, st []byte) []byte {
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	p := append(bytes.Clone(prefix), st...)
	h := bytes.Clone(hdr)
	binary.LittleEndian.PutUint64(h[72:], uint64(len(p)))
	binary.LittleEndian.PutUint32(h[80:], crc32.Checksum(p, castagnoli))
	binary.LittleEndian.PutUint32(h[92:], crc32.Checksum(h[:92], castagnoli))
	return append(h, p...)
}
