package ggufsynth

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/ollama/ollama/fs/ggml"
)

// The metadata keys llama.cpp's loader reads from each part of a model stored in
// several files: the part's index from 0 (uint16), the number of parts (uint16), and
// the number of tensors of the whole model (int32), in every part.
const (
	KeySplitNo           = "split.no"
	KeySplitCount        = "split.count"
	KeySplitTensorsCount = "split.tensors.count"
)

// MaxParts is the most parts a model can be stored in (split.count is 16 bits, and
// a part's name has five digits).
const MaxParts = 99999

// PartName is the file name of part no (from 1) of count of the model whose name,
// without that suffix, is prefix: prefix-00001-of-00003.gguf.
func PartName(prefix string, no, count int) string {
	return fmt.Sprintf("%s-%05d-of-%05d.gguf", prefix, no, count)
}

// WriteParts synthesizes the model described by spec as count files named
// PartName(prefix, i, count), the way models too large for one file are stored: the
// first part holds every metadata key and the first tensors; each later part holds
// only the split keys and its tensors. The tensors go in the order a one-file model
// writes them (by layer), in count runs of about the same number. The model loads
// from the first part's path, the others beside it, and answers as Write's file of
// the same spec does. It returns the parts' paths in order.
func WriteParts(prefix string, spec Spec, count int) ([]string, error) {
	return writeParts(prefix, spec, count, false)
}

// WritePartHeaders is WriteParts writing, as WriteHeader does, sparse files of the
// parts' full sizes whose weights are never written: for what reads only the headers
// of a model too large to synthesize here.
func WritePartHeaders(prefix string, spec Spec, count int) ([]string, error) {
	return writeParts(prefix, spec, count, true)
}

func writeParts(prefix string, spec Spec, count int, sparse bool) ([]string, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("invalid model spec: %w", err)
	}
	ts := tensors(spec)
	if count < 1 || count > min(MaxParts, len(ts)) {
		return nil, fmt.Errorf("%d parts: want 1 to %d (one tensor a part at least)", count, min(MaxParts, len(ts)))
	}
	slices.SortStableFunc(ts, func(a, b *ggml.Tensor) int {
		return cmp.Or(cmp.Compare(tensorBlock(a.Name), tensorBlock(b.Name)), cmp.Compare(a.Name, b.Name))
	})
	paths := make([]string, 0, count)
	for i, part := range splitEven(ts, count) {
		kv := []keyValue{}
		if i == 0 {
			kv = sortedKV(metadata(spec))
		}
		kv = append(kv,
			keyValue{KeySplitNo, uint16(i)},
			keyValue{KeySplitCount, uint16(count)},
			keyValue{KeySplitTensorsCount, int32(len(ts))})
		p := PartName(prefix, i+1, count)
		if err := writeAtomic(p, func(f *os.File) error { return writeGGUF(f, kv, part, sparse) }); err != nil {
			return nil, err
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// PartPrefix is the prefix of a part's file name (PartName's inverse), with its
// index from 1 and the number of parts; ok is false when name is not a part's.
func PartPrefix(name string) (prefix string, no, count int, ok bool) {
	const suffix = len("-00001-of-00003.gguf")
	if len(name) <= suffix || !strings.HasSuffix(name, ".gguf") {
		return "", 0, 0, false
	}
	prefix = name[:len(name)-suffix]
	if _, err := fmt.Sscanf(name[len(prefix):], "-%05d-of-%05d.gguf", &no, &count); err != nil ||
		PartName(prefix, no, count) != name || no < 1 || no > count {
		return "", 0, 0, false
	}
	return prefix, no, count, true
}

// tensorBlock is the layer a tensor belongs to; tensors of no layer sort last.
func tensorBlock(name string) int {
	var n int
	if _, err := fmt.Sscanf(name, "blk.%d.", &n); err != nil {
		return math.MaxInt
	}
	return n
}

// splitEven cuts ts into count runs whose lengths differ by one at most.
func splitEven(ts []*ggml.Tensor, count int) [][]*ggml.Tensor {
	out := make([][]*ggml.Tensor, 0, count)
	for i := range count {
		out = append(out, ts[i*len(ts)/count:(i+1)*len(ts)/count])
	}
	return out
}

// keyValue is one metadata entry, written in the order given.
type keyValue struct {
	key   string
	value any
}

func sortedKV(kv ggml.KV) []keyValue {
	out := make([]keyValue, 0, len(kv))
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range kv {
			if !yield(k) {
				return
			}
		}
	}) {
		out = append(out, keyValue{k, kv[k]})
	}
	return out
}

// GGUF value types.
const (
	ggufUint8 uint32 = iota
	ggufInt8
	ggufUint16
	ggufInt16
	ggufUint32
	ggufInt32
	ggufFloat32
	ggufBool
	ggufString
	ggufArray
	ggufUint64
	ggufInt64
	ggufFloat64
)

// writeGGUF writes a GGUF (version 3) file of kv and ts: the keys as given (no
// architecture prefix added), the tensors in the order given, each at the next
// aligned offset. A sparse file gets the header and its full size, no weights.
func writeGGUF(f *os.File, kv []keyValue, ts []*ggml.Tensor, sparse bool) error {
	w := bufio.NewWriterSize(f, 1<<20)
	b := append([]byte("GGUF"), 3, 0, 0, 0)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(ts)))
	b = binary.LittleEndian.AppendUint64(b, uint64(len(kv)))
	for _, e := range kv {
		var err error
		if b, err = appendKV(appendString(b, e.key), e.value); err != nil {
			return fmt.Errorf("metadata %s: %w", e.key, err)
		}
	}
	var off uint64
	for _, t := range ts {
		t.Offset = off
		b = appendString(b, t.Name)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(t.Shape)))
		for _, d := range t.Shape {
			b = binary.LittleEndian.AppendUint64(b, d)
		}
		b = binary.LittleEndian.AppendUint32(b, t.Kind)
		b = binary.LittleEndian.AppendUint64(b, t.Offset)
		off = alignUp(off + t.Size())
	}
	b = append(b, make([]byte, alignUp(uint64(len(b)))-uint64(len(b)))...)
	if _, err := w.Write(b); err != nil {
		return err
	}
	if sparse {
		if err := w.Flush(); err != nil {
			return err
		}
		return f.Truncate(int64(len(b)) + int64(off))
	}
	for _, t := range ts {
		n, err := t.WriteTo(w)
		if err != nil {
			return fmt.Errorf("tensor %s: %w", t.Name, err)
		}
		if uint64(n) != t.Size() {
			return fmt.Errorf("tensor %s: wrote %d bytes, want %d", t.Name, n, t.Size())
		}
		if _, err := w.Write(make([]byte, alignUp(uint64(n))-uint64(n))); err != nil {
			return err
		}
	}
	return w.Flush()
}

func alignUp(n uint64) uint64 { return (n + alignment - 1) / alignment * alignment }

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// appendKV appends a value's type and encoding.
func appendKV(b []byte, v any) ([]byte, error) {
	if t, ok := scalarType(v); ok {
		return appendScalar(binary.LittleEndian.AppendUint32(b, t), v), nil
	}
	var items []any
	switch v := v.(type) {
	case []string:
		items = toAny(v)
	case []int32:
		items = toAny(v)
	case []uint32:
		items = toAny(v)
	case []float32:
		items = toAny(v)
	case []bool:
		items = toAny(v)
	case []uint64:
		items = toAny(v)
	case []int64:
		items = toAny(v)
	default:
		return nil, fmt.Errorf("no GGUF type for %T", v)
	}
	var zero any = ""
	if len(items) > 0 {
		zero = items[0]
	}
	t, _ := scalarType(zero)
	b = binary.LittleEndian.AppendUint32(b, ggufArray)
	b = binary.LittleEndian.AppendUint32(b, t)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(items)))
	for _, it := range items {
		b = appendScalar(b, it)
	}
	return b, nil
}

func toAny[T any](s []T) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

func scalarType(v any) (uint32, bool) {
	switch v.(type) {
	case uint8:
		return ggufUint8, true
	case int8:
		return ggufInt8, true
	case uint16:
		return ggufUint16, true
	case int16:
		return ggufInt16, true
	case uint32:
		return ggufUint32, true
	case int32:
		return ggufInt32, true
	case float32:
		return ggufFloat32, true
	case bool:
		return ggufBool, true
	case string:
		return ggufString, true
	case uint64:
		return ggufUint64, true
	case int64:
		return ggufInt64, true
	case float64:
		return ggufFloat64, true
	}
	return 0, false
}

func appendScalar(b []byte, v any) []byte {
	le := binary.LittleEndian
	switch v := v.(type) {
	case uint8:
		return append(b, v)
	case int8:
		return append(b, byte(v))
	case uint16:
		return le.AppendUint16(b, v)
	case int16:
		return le.AppendUint16(b, uint16(v))
	case uint32:
		return le.AppendUint32(b, v)
	case int32:
		return le.AppendUint32(b, uint32(v))
	case float32:
		return le.AppendUint32(b, math.Float32bits(v))
	case bool:
		return append(b, map[bool]byte{false: 0, true: 1}[v])
	case string:
		return appendString(b, v)
	case uint64:
		return le.AppendUint64(b, v)
	case int64:
		return le.AppendUint64(b, uint64(v))
	case float64:
		return le.AppendUint64(b, math.Float64bits(v))
	}
	return b
}
