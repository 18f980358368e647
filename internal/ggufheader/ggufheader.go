// Package ggufheader checks the header of an untrusted GGUF file against size and
// count limits before anything allocates from what the header declares.
//
// A GGUF header is a list of counts and lengths followed by what they count: the
// number of metadata keys and tensors, the length of every string and array, and
// values such as a model's block count that a parser sizes per-layer tables by. A
// parser that trusts them allocates what the file says, not what it holds: a header
// of a few hundred bytes can declare a string of 4 GiB or a model of 2^40 layers.
// Scan walks the header once, streaming (it never allocates from a declared figure),
// and refuses the first declaration beyond Limits with a *LimitError that names the
// limit. A header that passes can be handed to a full parser: every count, length and
// layer count in it is at most the limit, and the header itself at most
// Limits.MaxHeaderBytes.
package ggufheader

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// Limits bound what a GGUF header may declare.
type Limits struct {
	// MaxHeaderBytes bounds the header: the metadata and the tensor infos.
	MaxHeaderBytes int64
	// MaxKVs bounds the number of metadata keys.
	MaxKVs uint64
	// MaxTensors bounds the number of tensors, declared in the header or by the
	// split.tensors.count key.
	MaxTensors uint64
	// MaxStringBytes bounds one string (a key, a value, an array item, a tensor name).
	MaxStringBytes uint64
	// MaxArrayLen bounds the items of one array.
	MaxArrayLen uint64
	// MaxBlockCount bounds the value of every *.block_count key (the layers a
	// parser sizes per-layer tables by).
	MaxBlockCount uint64
}

// DefaultLimits are an order of magnitude above the largest published models: a
// header of a 262k-token vocabulary with its merges is about 15 MiB, the longest
// strings are embedded tokenizer files of a few MiB, the largest arrays are
// vocabularies (under 1M items), headers have tens of keys and at most tens of
// thousands of tensors (mixture-of-experts models with one tensor per expert), and
// llama.cpp loads at most 512 layers.
var DefaultLimits = Limits{
	MaxHeaderBytes: 64 << 20,
	MaxKVs:         1 << 16,
	MaxTensors:     1 << 18,
	MaxStringBytes: 16 << 20,
	MaxArrayLen:    1 << 22,
	MaxBlockCount:  4096,
}

// LimitError is a header that declares more than a limit allows.
type LimitError struct {
	// Limit names the limit: "header size", "metadata key count", "tensor count",
	// "string length", "array length" or "block count".
	Limit string
	// Where says what declared it (a metadata key, a tensor), or is empty.
	Where    string
	Declared uint64
	Max      uint64
}

func (e *LimitError) Error() string {
	where := ""
	if e.Where != "" {
		where = " (" + e.Where + ")"
	}
	return fmt.Sprintf("the GGUF header declares a %s of %d%s, over the limit of %d: the file is corrupt or crafted, no published model comes near it",
		e.Limit, e.Declared, where, e.Max)
}

// FormatError is a header that is not well-formed GGUF (truncated, an unknown
// value type, an array of arrays).
type FormatError struct {
	Offset int64
	Reason string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("malformed GGUF header at byte %d: %s", e.Offset, e.Reason)
}

// ErrNotGGUF is a file that does not start with the GGUF magic.
var ErrNotGGUF = errors.New("not a GGUF file (it does not start with the GGUF magic)")

// value types of GGUF metadata.
const (
	typeUint8 uint32 = iota
	typeInt8
	typeUint16
	typeInt16
	typeUint32
	typeInt32
	typeFloat32
	typeBool
	typeString
	typeArray
	typeUint64
	typeInt64
	typeFloat64
)

// ggmlMaxDims is the most dimensions a tensor has (GGML_MAX_DIMS).
const ggmlMaxDims = 4

// Scan reads one GGUF header from the start of r and returns its length in bytes
// (through the last tensor info, without the alignment padding). It reads at most
// lim.MaxHeaderBytes (plus what a bufio.Reader reads ahead) and holds at most one
// key and one numeric value at a time. Errors: ErrNotGGUF, *LimitError,
// *FormatError, or r's own.
func Scan(r io.Reader, lim Limits) (int64, error) {
	s := &scanner{r: bufio.NewReaderSize(r, 64<<10), lim: lim}
	if err := s.scan(); err != nil {
		return s.n, err
	}
	return s.n, nil
}

// TensorNames scans one GGUF header from the start of r as Scan does and returns
// the names of its tensors in the header's order, each cut to its first 64 bytes (a
// GGML tensor name has at most 63): which part of a model stored in parts holds
// which layers' weights.
func TensorNames(r io.Reader, lim Limits) ([]string, error) {
	s := &scanner{r: bufio.NewReaderSize(r, 64<<10), lim: lim, names: []string{}}
	if err := s.scan(); err != nil {
		return nil, err
	}
	return s.names, nil
}

type scanner struct {
	r   *bufio.Reader
	lim Limits
	n   int64
	v1  bool
	// names collects the tensor names when not nil (TensorNames).
	names []string
}

func (s *scanner) scan() error {
	var magic [4]byte
	if err := s.read(magic[:]); err != nil || string(magic[:]) != "GGUF" {
		var le *LimitError
		if errors.As(err, &le) {
			return err
		}
		return ErrNotGGUF
	}
	version, err := s.u32()
	if err != nil {
		return err
	}
	if version < 1 || version > 3 {
		return s.malformed(4, fmt.Sprintf("unsupported version %d", version))
	}
	s.v1 = version == 1
	tensors, err := s.count("tensor count", "", s.lim.MaxTensors)
	if err != nil {
		return err
	}
	kvs, err := s.count("metadata key count", "", s.lim.MaxKVs)
	if err != nil {
		return err
	}
	for range kvs {
		if err := s.kv(); err != nil {
			return err
		}
	}
	for i := range tensors {
		if err := s.tensorInfo(i); err != nil {
			return err
		}
	}
	return nil
}

// readItemByItem are the suffixes of the keys whose arrays the parser reads item by
// item (it skips the others).
var readItemByItem = []string{".feed_forward_length", ".attention.head_count", ".attention.head_count_kv", ".attention.sliding_window_pattern"}

// kv reads one metadata key and its value.
func (s *scanner) kv() error {
	at := s.n
	key, err := s.str("a metadata key")
	if err != nil {
		return err
	}
	if key == "" {
		return s.malformed(at, "an empty metadata key")
	}
	where := fmt.Sprintf("key %q", key)
	at = s.n
	t, err := s.u32()
	if err != nil {
		return err
	}
	switch {
	case strings.HasSuffix(key, ".block_count"):
		return s.bounded(t, at, "block count", where, s.lim.MaxBlockCount)
	case key == "split.tensors.count":
		return s.bounded(t, at, "tensor count", where, s.lim.MaxTensors)
	}
	return s.value(t, at, where)
}

// bounded reads a numeric value of type t that must be at most max.
func (s *scanner) bounded(t uint32, at int64, limit, where string, max uint64) error {
	size, ok := scalarSize(t)
	if !ok {
		return s.value(t, at, where) // not a number: the parser refuses it, not the limit
	}
	var b [8]byte
	if err := s.read(b[:size]); err != nil {
		return err
	}
	v, ok := asUint(t, b[:size])
	if !ok || v > max {
		if !ok {
			v = math.MaxUint64
		}
		return &LimitError{Limit: limit, Where: where, Declared: v, Max: max}
	}
	return nil
}

// value skips one value of type t.
func (s *scanner) value(t uint32, at int64, where string) error {
	if size, ok := scalarSize(t); ok {
		return s.skip(uint64(size))
	}
	switch t {
	case typeString:
		return s.nonEmptyStr(where)
	case typeArray:
		et, err := s.u32()
		if err != nil {
			return err
		}
		n, err := s.count("array length", where, s.lim.MaxArrayLen)
		if err != nil {
			return err
		}
		if size, ok := scalarSize(et); ok {
			return s.skip(n * uint64(size)) // n ≤ MaxArrayLen: no overflow
		}
		switch et {
		case typeString:
			read := slices.ContainsFunc(readItemByItem, func(suffix string) bool { return strings.HasSuffix(where, suffix+`"`) })
			for range n {
				if read {
					if err := s.nonEmptyStr(where); err != nil {
						return err
					}
				} else if _, err := s.skipStr(where); err != nil {
					return err
				}
			}
			return nil
		case typeArray:
			return s.malformed(at, where+" is an array of arrays, which GGUF loaders do not read")
		}
		return s.malformed(at, fmt.Sprintf("%s: unknown array item type %d", where, et))
	}
	return s.malformed(at, fmt.Sprintf("%s: unknown value type %d", where, t))
}

func (s *scanner) tensorInfo(i uint64) error {
	where := fmt.Sprintf("tensor %d", i)
	if s.names != nil {
		at := s.n
		name, err := s.str(where + " name")
		if err != nil {
			return err
		}
		if name == "" {
			return s.malformed(at, "an empty string at "+where+" name, which GGUF parsers misread")
		}
		s.names = append(s.names, name)
	} else if err := s.nonEmptyStr(where + " name"); err != nil {
		return err
	}
	at := s.n
	dims, err := s.u32()
	if err != nil {
		return err
	}
	if dims == 0 || dims > ggmlMaxDims {
		return s.malformed(at, fmt.Sprintf("%s has %d dimensions (1 to %d)", where, dims, ggmlMaxDims))
	}
	dimSize := uint64(8)
	if s.v1 {
		dimSize = 4
	}
	return s.skip(uint64(dims)*dimSize + 4 + 8) // dimensions, type, offset
}

// str reads a string that is shown in errors (a key), quoted and cut to 64 bytes.
func (s *scanner) str(what string) (string, error) {
	n, err := s.strLen(what)
	if err != nil {
		return "", err
	}
	keep := min(n, 64)
	b := make([]byte, keep)
	if err := s.read(b); err != nil {
		return "", err
	}
	if err := s.skip(n - keep); err != nil {
		return "", err
	}
	return string(b), nil
}

// nonEmptyStr skips a string the parser reads whole: an empty one it reads as 32 KiB
// of what follows, which Scan cannot follow.
func (s *scanner) nonEmptyStr(where string) error {
	at := s.n
	n, err := s.skipStr(where)
	if err == nil && n == 0 {
		return s.malformed(at, "an empty string at "+where+", which GGUF parsers misread")
	}
	return err
}

func (s *scanner) skipStr(where string) (uint64, error) {
	n, err := s.strLen(where)
	if err != nil {
		return 0, err
	}
	return n, s.skip(n)
}

func (s *scanner) strLen(where string) (uint64, error) {
	return s.count("string length", where, s.lim.MaxStringBytes)
}

// count reads a count or a length (32 bits in version 1, 64 after) that must be at
// most max and fit in what is left of MaxHeaderBytes.
func (s *scanner) count(limit, where string, max uint64) (uint64, error) {
	var (
		v   uint64
		err error
	)
	if s.v1 {
		var v32 uint32
		v32, err = s.u32()
		v = uint64(v32)
	} else {
		v, err = s.u64()
	}
	if err != nil {
		return 0, err
	}
	if v > max {
		return 0, &LimitError{Limit: limit, Where: where, Declared: v, Max: max}
	}
	return v, nil
}

func (s *scanner) u32() (uint32, error) {
	var b [4]byte
	if err := s.read(b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b[:]), nil
}

func (s *scanner) u64() (uint64, error) {
	var b [8]byte
	if err := s.read(b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// read fills b, within MaxHeaderBytes.
func (s *scanner) read(b []byte) error {
	if err := s.room(uint64(len(b))); err != nil {
		return err
	}
	n, err := io.ReadFull(s.r, b)
	s.n += int64(n)
	return s.eof(err)
}

// skip discards n bytes, within MaxHeaderBytes.
func (s *scanner) skip(n uint64) error {
	if err := s.room(n); err != nil {
		return err
	}
	d, err := s.r.Discard(int(n))
	s.n += int64(d)
	return s.eof(err)
}

// room refuses to go beyond MaxHeaderBytes.
func (s *scanner) room(n uint64) error {
	left := uint64(max(s.lim.MaxHeaderBytes-s.n, 0))
	if n > left {
		return &LimitError{Limit: "header size", Declared: uint64(s.n) + n, Max: uint64(s.lim.MaxHeaderBytes)}
	}
	return nil
}

func (s *scanner) eof(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return s.malformed(s.n, "the header ends early")
	}
	return err
}

func (s *scanner) malformed(at int64, reason string) error {
	return &FormatError{Offset: at, Reason: reason}
}

// scalarSize is the size of a numeric or bool value type.
func scalarSize(t uint32) (int, bool) {
	switch t {
	case typeUint8, typeInt8, typeBool:
		return 1, true
	case typeUint16, typeInt16:
		return 2, true
	case typeUint32, typeInt32, typeFloat32:
		return 4, true
	case typeUint64, typeInt64, typeFloat64:
		return 8, true
	}
	return 0, false
}

// asUint reads a numeric value as a count; false for a negative or non-finite one.
func asUint(t uint32, b []byte) (uint64, bool) {
	var w [8]byte
	copy(w[:], b)
	u := binary.LittleEndian.Uint64(w[:])
	switch t {
	case typeInt8:
		return u, int8(u) >= 0
	case typeInt16:
		return u, int16(u) >= 0
	case typeInt32:
		return u, int32(u) >= 0
	case typeInt64:
		return u, int64(u) >= 0
	case typeFloat32:
		return floatCount(float64(math.Float32frombits(uint32(u))))
	case typeFloat64:
		return floatCount(math.Float64frombits(u))
	}
	return u, true
}

func floatCount(f float64) (uint64, bool) {
	if f != f || f < 0 || f >= math.MaxUint64 {
		return 0, false
	}
	return uint64(f), true
}
