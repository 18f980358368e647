package ggufsynth

import (
	"encoding/binary"
	"math"
)

// Raw builds a GGUF (version 3) header byte by byte, with whatever counts and
// lengths the caller declares, true or not: the crafted headers that the parsers of
// untrusted files must refuse. Add keys and tensors, then take Bytes.
type Raw struct {
	kvs, tensors []byte
	nKV, nTensor uint64
	// DeclaredKVs and DeclaredTensors, when non-zero, are written as the header's
	// counts instead of the numbers of keys and tensors added.
	DeclaredKVs, DeclaredTensors uint64
}

// Value types of GGUF metadata.
const (
	RawUint32  uint32 = 4
	RawString  uint32 = 8
	RawArray   uint32 = 9
	RawUint64  uint32 = 10
	RawFloat32 uint32 = 6
)

// String adds key with a string value.
func (r *Raw) String(key, v string) *Raw {
	r.kvs = rawStr(r.kvStart(key, RawString), v)
	return r
}

// Uint32 adds key with a uint32 value.
func (r *Raw) Uint32(key string, v uint32) *Raw {
	r.kvs = binary.LittleEndian.AppendUint32(r.kvStart(key, RawUint32), v)
	return r
}

// Uint64 adds key with a uint64 value.
func (r *Raw) Uint64(key string, v uint64) *Raw {
	r.kvs = binary.LittleEndian.AppendUint64(r.kvStart(key, RawUint64), v)
	return r
}

// Float32 adds key with a float32 value.
func (r *Raw) Float32(key string, v float32) *Raw {
	r.kvs = binary.LittleEndian.AppendUint32(r.kvStart(key, RawFloat32), math.Float32bits(v))
	return r
}

// StringLen adds key with a string value that declares n bytes and holds body.
func (r *Raw) StringLen(key string, n uint64, body []byte) *Raw {
	b := binary.LittleEndian.AppendUint64(r.kvStart(key, RawString), n)
	r.kvs = append(b, body...)
	return r
}

// ArrayLen adds key with an array of item type itemType that declares n items and
// holds body.
func (r *Raw) ArrayLen(key string, itemType uint32, n uint64, body []byte) *Raw {
	b := binary.LittleEndian.AppendUint32(r.kvStart(key, RawArray), itemType)
	b = binary.LittleEndian.AppendUint64(b, n)
	r.kvs = append(b, body...)
	return r
}

// Tensor adds an F32 tensor info of shape dims at data offset off.
func (r *Raw) Tensor(name string, off uint64, dims ...uint64) *Raw {
	b := rawStr(r.tensors, name)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(dims)))
	for _, d := range dims {
		b = binary.LittleEndian.AppendUint64(b, d)
	}
	b = binary.LittleEndian.AppendUint32(b, 0) // F32
	r.tensors = binary.LittleEndian.AppendUint64(b, off)
	r.nTensor++
	return r
}

// Bytes is the header: magic, version 3, the counts, the keys, the tensor infos.
func (r *Raw) Bytes() []byte {
	b := append([]byte("GGUF"), 3, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, orDeclared(r.DeclaredTensors, r.nTensor))
	b = binary.LittleEndian.AppendUint64(b, orDeclared(r.DeclaredKVs, r.nKV))
	b = append(b, r.kvs...)
	return append(b, r.tensors...)
}

func (r *Raw) kvStart(key string, t uint32) []byte {
	r.nKV++
	return binary.LittleEndian.AppendUint32(rawStr(r.kvs, key), t)
}

func rawStr(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

func orDeclared(declared, n uint64) uint64 {
	if declared != 0 {
		return declared
	}
	return n
}
