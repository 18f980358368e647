package promptcache

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/macfleet/macfleet/api/runnerapi"
)

var peerID = Identity{Model: "sha256-model", Format: "engine;kv=f16;seqs=1"}

// testState is a payload the tests' tokensOf reads: a token count, the tokens, then
// "state" bytes.
func testState(tokens []int32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(tokens)))
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	return append(b, "sequence state"...)
}

func testTokensOf(p []byte) ([]int32, error) {
	if len(p) < 4 {
		return nil, errors.New("short")
	}
	n := int(binary.LittleEndian.Uint32(p))
	if n == 0 || (len(p)-4)/4 < n {
		return nil, errors.New("bad token count")
	}
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(p[4+4*i:]))
	}
	return out, nil
}

// peerEntry is the entry a runner of peerID exports for tokens in partition.
func peerEntry(tokens []int32, partition string) (h, payload []byte) {
	payload = testState(tokens)
	k, _ := StateKey(peerID, partition, tokens, 4)
	return EncodeEntryHeader(peerID, k, payload), payload
}

// reseal recomputes a header's checksum after an edit (a well-formed header that says
// something else).
func reseal(h []byte) []byte {
	binary.LittleEndian.PutUint32(h[92:96], crc32.Checksum(h[:92], castagnoli))
	return h
}

type importCase struct {
	name      string
	h, p      []byte
	partition string
	limit     int64
	want      string // a PeerMiss reason, "" for imported
}

func TestCheckImport(t *testing.T) {
	tokens := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10} // two full blocks of 4 and two more
	h, payload := peerEntry(tokens, "team-a")
	flip := func(b []byte, i int) []byte { b = bytes.Clone(b); b[i] ^= 1; return b }
	// Well-formed entries (checksums that match) that say something else.
	forged := flip(payload, 4) // another first token: the key no longer matches
	notState := []byte{0, 0, 0, 0}
	otherID := Identity{Model: peerID.Model, Format: "engine;kv=q8_0;seqs=1"}
	version := bytes.Clone(h)
	version[4] = 2
	sh, sp := peerEntry([]int32{1, 2, 3}, "team-a")
	cases := []importCase{
		{name: "valid", h: h, p: payload, partition: "team-a"},
		{name: "payload at the limit", h: h, p: payload, partition: "team-a", limit: int64(len(payload))},
		{name: "another partition", h: h, p: payload, partition: "team-b", want: runnerapi.PeerMissKey},
		{name: "the shared partition", h: h, p: payload, want: runnerapi.PeerMissKey},
		{name: "forged tokens", h: EncodeEntryHeader(peerID, Key(h[40:72]), forged), p: forged, partition: "team-a", want: runnerapi.PeerMissKey},
		{name: "no full block", h: sh, p: sp, partition: "team-a", want: runnerapi.PeerMissKey},
		{name: "payload over the limit", h: h, p: payload, partition: "team-a", limit: int64(len(payload) - 1), want: runnerapi.PeerMissTooLarge},
		{name: "another format version", h: reseal(version), p: payload, partition: "team-a", want: runnerapi.PeerMissIncompatible},
		{name: "another identity", h: EncodeEntryHeader(otherID, Key(h[40:72]), payload), p: payload, partition: "team-a", want: runnerapi.PeerMissIncompatible},
		{name: "short header", h: h[:headerSize-1], p: payload, partition: "team-a", want: runnerapi.PeerMissCorrupt},
		{name: "bad magic", h: reseal(append([]byte("XXXX"), h[4:]...)), p: payload, partition: "team-a", want: runnerapi.PeerMissCorrupt},
		{name: "header byte flipped", h: flip(h, 50), p: payload, partition: "team-a", want: runnerapi.PeerMissCorrupt},
		{name: "header checksum flipped", h: flip(h, 93), p: payload, partition: "team-a", want: runnerapi.PeerMissCorrupt},
		{name: "payload byte flipped", h: h, p: flip(payload, len(payload)-1), partition: "team-a", want: runnerapi.PeerMissCorrupt},
		{name: "payload truncated", h: h, p: payload[:len(payload)-1], partition: "team-a", want: runnerapi.PeerMissCorrupt},
		{name: "payload longer", h: h, p: append(bytes.Clone(payload), 0), partition: "team-a", want: runnerapi.PeerMissCorrupt},
		{name: "not a state", h: EncodeEntryHeader(peerID, Key(h[40:72]), notState), p: notState, partition: "team-a", want: runnerapi.PeerMissCorrupt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			limit := c.limit
			if limit == 0 {
				limit = 1 << 20
			}
			imp, m := CheckImport(c.h, c.p, peerID, c.partition, 4, limit, testTokensOf)
			if c.want != "" {
				if m == nil || m.Reason != c.want || m.Detail == "" {
					t.Fatalf("CheckImport = %+v, %v; want a %s miss with a detail", imp, m, c.want)
				}
				return
			}
			if m != nil {
				t.Fatalf("CheckImport: %v", m)
			}
			keys := BlockKeys(peerID, c.partition, tokens, 4)
			if imp.Key != keys[1] || !slices.Equal(imp.BlockKeys, keys) || !slices.Equal(imp.Tokens, tokens) || !bytes.Equal(imp.Payload, payload) {
				t.Fatalf("CheckImport = %+v, want key %s, keys %v, the tokens and the payload", imp, keys[1], keys)
			}
		})
	}
}

// FuzzCheckImport: whatever bytes arrive, CheckImport refuses them with a known
// reason or returns exactly the payload of a header a runner of this identity would
// write, under the key its tokens give in the partition.
func FuzzCheckImport(f *testing.F) {
	h, p := peerEntry([]int32{1, 2, 3, 4, 5, 6, 7, 8, 9}, "team-a")
	f.Add(append(bytes.Clone(h), p...))
	f.Add(bytes.Clone(h))
	huge := bytes.Clone(h)
	huge[72+7] = 0x40
	f.Add(append(reseal(huge), p...))
	reasons := []string{runnerapi.PeerMissCorrupt, runnerapi.PeerMissIncompatible, runnerapi.PeerMissKey, runnerapi.PeerMissTooLarge}
	f.Fuzz(func(t *testing.T, data []byte) {
		hdr, payload := data[:min(len(data), headerSize)], data[min(len(data), headerSize):]
		imp, m := CheckImport(hdr, payload, peerID, "team-a", 4, 1<<16, testTokensOf)
		if m != nil {
			if !slices.Contains(reasons, m.Reason) || m.Detail == "" {
				t.Fatalf("a miss of reason %q (%q)", m.Reason, m.Detail)
			}
			return
		}
		if !bytes.Equal(imp.Payload, payload) || !bytes.Equal(hdr[:84], EncodeEntryHeader(peerID, imp.Key, payload)[:84]) {
			t.Fatalf("accepted an entry a runner of this identity would not write")
		}
		if k, ok := StateKey(peerID, "team-a", imp.Tokens, 4); !ok || k != imp.Key {
			t.Fatalf("accepted key %s for tokens whose key is %s", imp.Key, k)
		}
	})
}

// TestOpenEntry: an export streams the SSD file whole once its header checks out; a
// missing key or a damaged header opens nothing.
func TestOpenEntry(t *testing.T) {
	s := openSSD(t, SSDConfig{Identity: peerID})
	data := payload(1, 1000)
	if err := s.Save(key(1), data); err != nil {
		t.Fatal(err)
	}
	waitSettled(t, s)
	f, size, err := s.OpenEntry(key(1))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(f)
	f.Close()
	want := append(EncodeEntryHeader(peerID, key(1), data), data...)
	if err != nil || size != int64(len(want)) || !bytes.Equal(got, want) {
		t.Fatalf("OpenEntry read %d bytes (size %d, %v), want the %d bytes of header and payload", len(got), size, err, len(want))
	}
	if _, _, err := s.OpenEntry(key(2)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("OpenEntry of a key never saved: %v, want ErrNotExist", err)
	}
	path := filepath.Join(s.Dir(), filesOf(t, s, key(1))[0])
	damaged := bytes.Clone(want)
	damaged[50] ^= 1
	if err := os.WriteFile(path, damaged, 0o600); err != nil {
		t.Fatal(err)
	}
	if f, _, err := s.OpenEntry(key(1)); !errors.Is(err, errCorrupt) {
		if f != nil {
			f.Close()
		}
		t.Fatalf("OpenEntry of a damaged header: %v, want errCorrupt", err)
	}
}

// TestPrefixTableBackings: an export tries the backing that spares the most tokens
// first; a digest the table does not hold has none.
func TestPrefixTableBackings(t *testing.T) {
	pt := NewPrefixTable("e")
	pt.Associate([]string{"d1", "d2"}, Backing{State: key(1), Tokens: 64})
	pt.Associate([]string{"d1"}, Backing{State: key(2), Tokens: 256})
	pt.Associate([]string{"d1"}, Backing{State: key(3), Tokens: 128})
	want := []Backing{{key(2), 256}, {key(3), 128}, {key(1), 64}}
	if got := pt.Backings("d1"); !slices.Equal(got, want) {
		t.Errorf("Backings(d1) = %v, want %v", got, want)
	}
	if got := pt.Backings("d2"); !slices.Equal(got, []Backing{{key(1), 64}}) {
		t.Errorf("Backings(d2) = %v", got)
	}
	if got := pt.Backings("d3"); got != nil {
		t.Errorf("Backings of an unknown digest = %v, want none", got)
	}
}

// TestHotPeek: an export reads a hot state without counting a hit or making it recently
// used.
func TestHotPeek(t *testing.T) {
	h := NewHot(200)
	h.Put(key(0), payload(0, 100))
	h.Put(key(1), payload(1, 100))
	if data, ok := h.Peek(key(0)); !ok || !bytes.Equal(data, payload(0, 100)) {
		t.Fatalf("Peek(key 0) = %d bytes, %v", len(data), ok)
	}
	if _, ok := h.Peek(key(2)); ok {
		t.Fatal("Peek found a key never put")
	}
	if st := h.Stats(); st.Hits != 0 || st.Misses != 0 {
		t.Errorf("Peek counted %d hits and %d misses", st.Hits, st.Misses)
	}
	h.Put(key(2), payload(2, 100)) // evicts the least recently used: still key 0
	if got := hotKeys(h); !slices.Equal(got, []Key{key(2), key(1)}) {
		t.Errorf("after a Peek of key 0 and a Put, the hot tier holds %v, want keys 2 and 1", got)
	}
}
