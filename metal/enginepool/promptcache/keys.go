package promptcache

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
)

// Identity says what a saved state can be restored into. Two identities never share
// a key, a directory or a file.
type Identity struct {
	// Model identifies the weights, e.g. the digest of the GGUF file.
	Model string `json:"model"`
	// Format identifies the serialized state layout: whatever changes the bytes of a
	// state for the same tokens (engine version, KV cache type, per-slot context...).
	Format string `json:"format"`
}

// Hash is the SHA-256 of the identity; it seeds every key and is written into every
// SSD file header.
func (id Identity) Hash() [32]byte {
	h := sha256.New()
	h.Write([]byte("macfleet-promptcache-identity\x00"))
	writeString(h, id.Model)
	writeString(h, id.Format)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// DirName is the identity's directory under a cache directory: a readable prefix of
// the model name followed by 16 hex digits of Hash.
func (id Identity) DirName() string {
	var b strings.Builder
	for _, r := range id.Model {
		if b.Len() >= 48 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		b.WriteString("model")
	}
	h := id.Hash()
	return b.String() + "-" + hex.EncodeToString(h[:8])
}

// Key is the chained hash of one block-aligned token prefix.
type Key [32]byte

// String is the key in hex.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// BlockKeys returns the key of every full block prefix of tokens: keys[i] covers the
// first (i+1)*blockSize tokens and is H(keys[i-1], tokens of block i), the chain
// seeded by the identity, the block size and the partition. Tokens after the last
// full block get no key. A prompt that extends an earlier one of the same partition
// therefore shares the earlier one's keys; no key of one partition is a key of
// another. The shared partition "" seeds the chain as before partitions existed, so
// SSD tiers written then stay valid. blockSize < 1 is treated as 1.
func BlockKeys(id Identity, partition string, tokens []int32, blockSize int) []Key {
	if blockSize < 1 {
		blockSize = 1
	}
	n := len(tokens) / blockSize
	if n == 0 {
		return nil
	}
	idh := id.Hash()
	seed := sha256.New()
	seed.Write([]byte("macfleet-promptcache-chain-v1\x00"))
	seed.Write(idh[:])
	var bs [8]byte
	binary.LittleEndian.PutUint64(bs[:], uint64(blockSize))
	seed.Write(bs[:])
	if partition != "" {
		seed.Write([]byte("partition\x00"))
		writeString(seed, partition)
	}
	var prev Key
	seed.Sum(prev[:0])

	keys := make([]Key, n)
	buf := make([]byte, len(prev)+4*blockSize)
	for i := range n {
		copy(buf, prev[:])
		block := tokens[i*blockSize : (i+1)*blockSize]
		for j, t := range block {
			binary.LittleEndian.PutUint32(buf[len(prev)+4*j:], uint32(t))
		}
		prev = sha256.Sum256(buf)
		keys[i] = prev
	}
	return keys
}

func writeString(h interface{ Write([]byte) (int, error) }, s string) {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
	h.Write(n[:])
	h.Write([]byte(s))
}
