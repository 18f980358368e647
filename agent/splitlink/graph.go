package splitlink

import (
	"encoding/binary"
	"fmt"
	"io"
)

// A graph's tensors, as wire.h's mfnd_tensor lays them out after each record's u32
// index: the guard checks each record's index, type, op and extents before the
// worker reads it, so the worker builds only tensors of types ggml has and ops
// llama.cpp's graphs use. The custom ops are refused above all: their op params
// carry function pointers the worker would call.
const (
	tensorType   = 4 + 8  // int32 type
	tensorOp     = 4 + 12 // int32 op
	tensorExtent = 4 + 24 // int64 ne[4]
	// graphChunk is how many records the guard reads, checks and writes at once.
	graphChunk = 256
)

// ggml's enums as the vendored ggml.h numbers them (TestGGMLNumbering checks them
// against it): the ops from NONE up to the first custom op are what inference
// graphs use, and GLU after the training ops; types are those ggml defines.
const (
	ggmlOpMapCustom1 = 86 // MAP_CUSTOM1..3, CUSTOM, then the training ops
	ggmlOpGLU        = 94
	ggmlOpCount      = 95
	ggmlTypeCount    = 40
)

// ggmlTypeGone are the type numbers below ggmlTypeCount that ggml no longer defines.
var ggmlTypeGone = map[int32]bool{4: true, 5: true, 31: true, 32: true, 33: true, 36: true, 37: true, 38: true}

// checkTensor checks one graph record of a graph of nTensors tensors.
func checkTensor(rec []byte, nTensors uint32) string {
	if idx := binary.LittleEndian.Uint32(rec); idx >= nTensors {
		return fmt.Sprintf("tensor index %d in a graph of %d tensors", idx, nTensors)
	}
	typ := int32(binary.LittleEndian.Uint32(rec[tensorType:]))
	if typ < 0 || typ >= ggmlTypeCount || ggmlTypeGone[typ] {
		return fmt.Sprintf("tensor type %d, which ggml does not define", typ)
	}
	op := int32(binary.LittleEndian.Uint32(rec[tensorOp:]))
	if op < 0 || (op >= ggmlOpMapCustom1 && op != ggmlOpGLU) || op >= ggmlOpCount {
		return fmt.Sprintf("op %d, not one of an inference graph's (custom ops, training ops and unknown numbers are refused)", op)
	}
	for i := range 4 {
		if ne := int64(binary.LittleEndian.Uint64(rec[tensorExtent+8*i:])); ne < 0 {
			return fmt.Sprintf("a negative extent %d", ne)
		}
	}
	return ""
}

// copyGraph copies a COMPUTE frame whose frame and graph headers (head, the frame
// checked by CheckFrame) say its counts: the changed tensors' records and the node
// indexes, graphChunk at a time, each checked before it is written, head with the
// first; a graph that fits one chunk is checked whole before a byte of it is.
func copyGraph(dst io.Writer, src io.Reader, head []byte, size uint32) error {
	h := head[5:]
	nTensors, nNodes, nChanged := binary.LittleEndian.Uint32(h), binary.LittleEndian.Uint32(h[4:]), binary.LittleEndian.Uint32(h[8:])
	if binary.LittleEndian.Uint32(h[12:]) == 0 {
		nNodes = 0 // the previous graph's nodes
	}
	buf := make([]byte, len(head), len(head)+graphChunk*graphRecordBytes)
	copy(buf, head)
	// flush writes what is checked: the headers and the records read so far.
	flush := func() error {
		_, err := dst.Write(buf)
		buf = buf[:0]
		return err
	}
	read := func(n int, check func([]byte) string) error {
		if len(buf)+n > cap(buf) {
			if err := flush(); err != nil {
				return err
			}
		}
		at := len(buf)
		buf = buf[:at+n]
		if _, err := io.ReadFull(src, buf[at:]); err != nil {
			return err
		}
		if why := check(buf[at:]); why != "" {
			return refusal(cmdCompute, size)("%s", why)
		}
		return nil
	}
	for left := nChanged; left > 0; left-- {
		if err := read(graphRecordBytes, func(rec []byte) string { return checkTensor(rec, nTensors) }); err != nil {
			return err
		}
	}
	for left := nNodes; left > 0; left-- {
		if err := read(4, func(b []byte) string {
			if idx := binary.LittleEndian.Uint32(b); idx >= nTensors {
				return fmt.Sprintf("node %d in a graph of %d tensors", idx, nTensors)
			}
			return ""
		}); err != nil {
			return err
		}
	}
	return flush()
}
