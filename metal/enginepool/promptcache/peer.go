package promptcache

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// A state moves between two runners (a peer fetch, runnerapi.PeerStateResult) as one
// entry in the SSD file format: the header (identity hash, key, payload length and
// CRC-32C) and the payload. The importing runner checks it all before it keeps
// anything (CheckImportHeader, CheckImport): these checks are pure, on bytes.

// EntryHeaderSize is the size of the header that precedes an entry's payload.
const EntryHeaderSize = headerSize

// MaxPeerStateBytes is the hard cap on one imported entry, whatever the tiers' sizes.
const MaxPeerStateBytes = 16 << 30

// EncodeEntryHeader is the header of an entry holding payload under key, written by
// identity id (the SSD file format).
func EncodeEntryHeader(id Identity, key Key, payload []byte) []byte {
	return encodeHeader(id.Hash(), key, payload)
}

// ImportMiss is why an entry was not imported: Reason is one of runnerapi.PeerMiss*.
type ImportMiss struct {
	Reason string
	Detail string
}

func (m *ImportMiss) Error() string { return m.Reason + ": " + m.Detail }

func miss(reason, format string, args ...any) *ImportMiss {
	return &ImportMiss{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// CheckImportHeader checks an entry's header before its payload is read: its magic
// and checksum (else corrupt), its format version and identity (else incompatible:
// another macfleet file format, model file, engine format or context setting), and a
// payload length of at most limit bytes (else too_large). It returns the key and the
// payload's length and CRC-32C.
func CheckImportHeader(h []byte, id Identity, limit int64) (key Key, n int64, sum uint32, err *ImportMiss) {
	if len(h) < headerSize {
		return key, 0, 0, miss(runnerapi.PeerMissCorrupt, "short header: %d bytes, want %d", len(h), headerSize)
	}
	if string(h[0:4]) != fileMagic {
		return key, 0, 0, miss(runnerapi.PeerMissCorrupt, "not a prompt cache entry (bad magic)")
	}
	if crc32.Checksum(h[:92], castagnoli) != binary.LittleEndian.Uint32(h[92:96]) {
		return key, 0, 0, miss(runnerapi.PeerMissCorrupt, "header checksum mismatch")
	}
	if v := binary.LittleEndian.Uint32(h[4:8]); v != formatVersion {
		return key, 0, 0, miss(runnerapi.PeerMissIncompatible, "entry format version %d, this runner reads %d", v, formatVersion)
	}
	if [32]byte(h[8:40]) != id.Hash() {
		return key, 0, 0, miss(runnerapi.PeerMissIncompatible,
			"saved by another model file, engine format or context setting (this runner: model %s, format %s)", id.Model, id.Format)
	}
	u := binary.LittleEndian.Uint64(h[72:80])
	if u > uint64(limit) {
		return key, 0, 0, miss(runnerapi.PeerMissTooLarge, "payload of %d bytes, this runner takes at most %d", u, limit)
	}
	return Key(h[40:72]), int64(u), binary.LittleEndian.Uint32(h[80:84]), nil
}

// Imported is an entry that passed CheckImport: its key, the tokens its state holds,
// the key of each of their full blocks (the last is Key), and the payload to store
// under Key.
type Imported struct {
	Key       Key
	Tokens    []int32
	BlockKeys []Key
	Payload   []byte
}

// CheckImport checks a whole entry (header h, payload as received) for identity id and
// partition with blocks of block tokens: the header (CheckImportHeader), the payload's
// length and CRC-32C (else corrupt), that tokensOf decodes it as a state (else
// corrupt), and that key is the key of the state's deepest full block in partition
// (else key_mismatch: another partition's state, or a forged one).
func CheckImport(h, payload []byte, id Identity, partition string, block int, limit int64,
	tokensOf func(payload []byte) ([]int32, error)) (Imported, *ImportMiss) {
	key, n, sum, m := CheckImportHeader(h, id, limit)
	if m != nil {
		return Imported{}, m
	}
	if int64(len(payload)) != n {
		return Imported{}, miss(runnerapi.PeerMissCorrupt, "payload of %d bytes, the header says %d", len(payload), n)
	}
	if crc32.Checksum(payload, castagnoli) != sum {
		return Imported{}, miss(runnerapi.PeerMissCorrupt, "payload checksum mismatch")
	}
	tokens, err := tokensOf(payload)
	if err != nil {
		return Imported{}, miss(runnerapi.PeerMissCorrupt, "the payload is not a state: %v", err)
	}
	keys := BlockKeys(id, partition, tokens, block)
	if len(keys) == 0 || keys[len(keys)-1] != key {
		return Imported{}, miss(runnerapi.PeerMissKey,
			"the key is not what the state's %d tokens give in this partition", len(tokens))
	}
	return Imported{Key: key, Tokens: tokens, BlockKeys: keys, Payload: payload}, nil
}

// StateKey is the key a state holding tokens is saved under in partition: the key of
// its deepest full block (ok false when it holds no full block).
func StateKey(id Identity, partition string, tokens []int32, block int) (Key, bool) {
	keys := BlockKeys(id, partition, tokens, block)
	if len(keys) == 0 {
		return Key{}, false
	}
	return keys[len(keys)-1], true
}

// OpenEntry opens the SSD file of key for reading it whole (header and payload, as
// an export streams it) after checking its header; size is the file's size. The
// payload's checksum is not read: whoever reads the payload checks it. The file
// stays readable while open even if the tier evicts it meanwhile.
func (s *SSD) OpenEntry(key Key) (f *os.File, size int64, err error) {
	s.mu.Lock()
	e, ok := s.entries[key]
	s.mu.Unlock()
	if !ok {
		return nil, 0, os.ErrNotExist
	}
	if f, err = os.Open(e.path); err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err == nil {
		var h [headerSize]byte
		if _, err = io.ReadFull(f, h[:]); err == nil {
			_, _, err = parseHeader(h[:], s.idHash, key, st.Size())
		}
		if err == nil {
			_, err = f.Seek(0, io.SeekStart)
		}
	}
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, st.Size(), nil
}
