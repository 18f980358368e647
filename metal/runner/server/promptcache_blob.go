//go:build cgo && !race

package server

import (
	"encoding/binary"
	"errors"
	"io"

	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
)

// A cached blob is a small header, the tokens the state holds, and the llama.cpp
// sequence state:
//
//	0   magic "MFKV"
//	4   version (uint32, little endian)
//	8   kind (uint32): 0 state, 1 reference
//	12  state: token count n (uint32), then n tokens (int32), then the state bytes
//	    reference: the key (32 bytes) of the state it points to
//
// A reference is what the key of the prompt's deepest block holds when the state was
// saved deeper (prompt + generated tokens): a next turn whose prompt re-tokenizes the
// generated text differently still finds the prompt's part, without storing the state
// twice. The prompt's shallower blocks hold one too (when they hold nothing else), so
// that another conversation sharing only the start of the prompt finds the state.
const (
	blobMagic   = "MFKV"
	blobVersion = 1
	kindState   = 0
	kindRef     = 1
	blobHeader  = 16
	refSize     = 12 + 32
)

var errBadBlob = errors.New("malformed prompt cache entry")

func encodeStateHeader(tokens []int32) []byte {
	b := make([]byte, blobHeader+4*len(tokens))
	copy(b, blobMagic)
	binary.LittleEndian.PutUint32(b[4:], blobVersion)
	binary.LittleEndian.PutUint32(b[8:], kindState)
	binary.LittleEndian.PutUint32(b[12:], uint32(len(tokens)))
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[blobHeader+4*i:], uint32(t))
	}
	return b
}

func encodeRef(key promptcache.Key) []byte {
	b := make([]byte, refSize)
	copy(b, blobMagic)
	binary.LittleEndian.PutUint32(b[4:], blobVersion)
	binary.LittleEndian.PutUint32(b[8:], kindRef)
	copy(b[12:], key[:])
	return b
}

// decodeBlob returns a state's tokens and state bytes, or the key a reference points
// to (ref true).
func decodeBlob(b []byte) (tokens []int32, state []byte, ref promptcache.Key, isRef bool, err error) {
	if len(b) < 12 || string(b[:4]) != blobMagic || binary.LittleEndian.Uint32(b[4:]) != blobVersion {
		return nil, nil, ref, false, errBadBlob
	}
	switch binary.LittleEndian.Uint32(b[8:]) {
	case kindRef:
		if len(b) != refSize {
			return nil, nil, ref, false, errBadBlob
		}
		return nil, nil, promptcache.Key(b[12:]), true, nil
	case kindState:
	default:
		return nil, nil, ref, false, errBadBlob
	}
	if len(b) < blobHeader {
		return nil, nil, ref, false, errBadBlob
	}
	n := int(binary.LittleEndian.Uint32(b[12:]))
	if n == 0 || (len(b)-blobHeader)/4 < n || len(b) == blobHeader+4*n {
		return nil, nil, ref, false, errBadBlob
	}
	tokens = make([]int32, n)
	for i := range tokens {
		tokens[i] = int32(binary.LittleEndian.Uint32(b[blobHeader+4*i:]))
	}
	return tokens, b[blobHeader+4*n:], ref, false, nil
}

// readBlobStart reads the start of a blob of size bytes from r: the tokens of a state
// (leaving r at its state bytes), or the key a reference points to (ref true). It
// reads no more than the header and the tokens, so a state is never loaded whole.
func readBlobStart(r io.Reader, size int64) (tokens []int32, ref promptcache.Key, isRef bool, err error) {
	var h [blobHeader]byte
	if size < 12 {
		return nil, ref, false, errBadBlob
	}
	if _, err := io.ReadFull(r, h[:12]); err != nil {
		return nil, ref, false, err
	}
	if string(h[:4]) != blobMagic || binary.LittleEndian.Uint32(h[4:]) != blobVersion {
		return nil, ref, false, errBadBlob
	}
	switch binary.LittleEndian.Uint32(h[8:]) {
	case kindRef:
		if size != refSize {
			return nil, ref, false, errBadBlob
		}
		_, err := io.ReadFull(r, ref[:])
		return nil, ref, err == nil, err
	case kindState:
	default:
		return nil, ref, false, errBadBlob
	}
	if _, err := io.ReadFull(r, h[12:]); err != nil {
		return nil, ref, false, err
	}
	n := int64(binary.LittleEndian.Uint32(h[12:]))
	if n == 0 || blobHeader+4*n >= size {
		return nil, ref, false, errBadBlob
	}
	raw := make([]byte, 4*n)
	if _, err := io.ReadFull(r, raw); err != nil {
		return nil, ref, false, err
	}
	tokens = make([]int32, n)
	for i := range tokens {
		tokens[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return tokens, ref, false, nil
}

// stateTokens returns the tokens of a state blob (a reference is not a state).
func stateTokens(b []byte) ([]int32, error) {
	tokens, _, _, isRef, err := decodeBlob(b)
	if err == nil && isRef {
		err = errors.New("a reference, not a state")
	}
	return tokens, err
}
