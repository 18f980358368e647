package e2e

import (
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"
)

// More of ggml's numbers (the vendored ggml.h) for the node attacks.
const (
	ggmlTypeI32    = 26
	ggmlTypeI64    = 27
	ggmlOpSet      = 33
	ggmlOpGetRows  = 40
	ggmlOpSetRows  = 42
	canaryOffset   = 4096
	canaryLength   = 4096
	attackNodeAddr = canaryOffset // where each attack's node lies, in the canary
)

// typed is a contiguous tensor of type typ (element size size) with extents ne at
// data, computed by op from srcs.
func typed(id uint64, typ, op int32, size uint64, ne [4]int64, data uint64, srcs ...uint64) wireTensor {
	r := wireTensor{id: id, typ: typ, op: op, ne: ne, data: data}
	r.nb[0] = size
	for k := 1; k < 4; k++ {
		r.nb[k] = r.nb[k-1] * uint64(ne[k-1])
	}
	copy(r.src[:], srcs)
	return r
}

func f32s(n int, v float32) []byte {
	b := make([]byte, 0, 4*n)
	for range n {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

// TestAttackSplitWorkerWritesPastItsNodes: a holder of a worker's secret sends nodes
// of the allowed ops whose shapes no ggml constructor makes, so that the CPU kernel,
// which follows another tensor's shape, writes past the node (every tensor's own
// bytes are within a buffer, which the worker checked before): a GET_ROWS of 16 bytes
// whose index tensor has 8 rows (128 bytes written), a SET_ROWS whose values' rows are
// 64 floats into a destination of 4, a SET whose signed offset of -4000 wraps the
// kernel's bound check and writes 4,000 bytes before its node, and a SET whose view ends
// past its destination (the kernel's check admits one element more); and a GET_ROWS
// of row 99 of a table of 4 (sent, not computed). Each node lies in a 4 KiB canary of
// 0xAA bytes; a node placed at its buffer's end writes past the buffer alike. On main
// the worker computed the first four: the canary came back overwritten; the CPU
// kernel's assertion on row 99 ended the worker (Metal's kernel reads where the index
// points). Now each node is rebuilt through ggml's constructor for its op and refused
// with an error naming the difference, row indices the graph does not compute are
// checked against their table before it runs, nothing is computed, and the worker
// serves an honest runner after the last.
func TestAttackSplitWorkerWritesPastItsNodes(t *testing.T) {
	const buf = 1 << 16
	cases := nodeAttacks()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := startAttackWorker(t)
			c, _ := w.session(t, make([]byte, 16))
			base := c.alloc(buf)
			canary := bytes.Repeat([]byte{0xaa}, canaryLength)
			c.send(wireFrame(wireSet, u64s(base+canaryOffset, canaryLength), canary), tc.frames(base))
			status, p := c.read(30 * time.Second)
			if status == 0 {
				// Computed: what did the node write outside its own bytes?
				c.send(wireFrame(wireGet, u64s(base+canaryOffset, canaryLength)))
				_, got := c.read(30 * time.Second)
				g := tc.graph(base)
				node := g[len(g)-1]
				lo, hi := node.data-base-canaryOffset, node.data-base-canaryOffset+uint64(node.ne[0]*node.ne[1]*4)
				changed := 0
				for k, b := range got {
					if b != 0xaa && (uint64(k) < lo || uint64(k) >= hi) {
						changed++
					}
				}
				t.Errorf("the worker computed the node; it changed %d bytes outside its own %d", changed, hi-lo)
			} else if status != 1 || !strings.Contains(string(p), tc.want) {
				t.Errorf("the worker answered status %d (%q), want an error naming %q", status, tail(string(p), 300), tc.want)
			}
			c.conn.Close()
			w.alive(t, tc.name)
			if i == len(cases)-1 {
				w.servesAnHonestRunner(t)
			}
		})
	}
}

// nodeAttack is one node of TestAttackSplitWorkerWritesPastItsNodes: the frames
// filling its sources, then its graph, whose last tensor is the node.
type nodeAttack struct {
	name, want string
	sources    func(base uint64) []byte // wireSet frames filling the sources
	graph      func(base uint64) []wireTensor
}

// frames are the attack's frames for a buffer at base: its sources, its graph.
func (a nodeAttack) frames(base uint64) []byte {
	g := a.graph(base)
	return append(a.sources(base), wireFrame(wireCompute, wireGraph(g, []uint32{uint32(len(g) - 1)}, 0))...)
}

// rowsGraph is a GET_ROWS or SET_ROWS node of 4 floats at the canary, whose sources
// are an F32 tensor of extents src at base and the indices idx.
func rowsGraph(base uint64, op int32, src [4]int64, idx wireTensor) []wireTensor {
	return []wireTensor{typed(1, 0, 0, 4, src, base), idx, typed(3, 0, op, 4, [4]int64{4, 1, 1, 1}, base+attackNodeAddr, 1, 2)}
}

func nodeAttacks() []nodeAttack {
	one := [4]int64{1, 1, 1, 1}
	shape := func(ne0, ne1 int64) [4]int64 { return [4]int64{ne0, ne1, 1, 1} }
	return []nodeAttack{
		{"GET_ROWS shorter than its indices", "where ggml builds f32 [4, 8, 1, 1]", func(base uint64) []byte {
			return wireFrame(wireSet, u64s(base, 64), f32s(16, 1))
		}, func(base uint64) []wireTensor {
			return rowsGraph(base, ggmlOpGetRows, shape(4, 4), typed(2, ggmlTypeI32, 0, 4, shape(8, 1), base+1024))
		}},
		{"GET_ROWS of a row its table lacks", "row index 0 is 99, outside the 4 rows", func(base uint64) []byte {
			return append(wireFrame(wireSet, u64s(base, 64), f32s(16, 1)), wireFrame(wireSet, u64s(base+1024, 4), u64s(99)[:4])...)
		}, func(base uint64) []wireTensor {
			return rowsGraph(base, ggmlOpGetRows, shape(4, 4), typed(2, ggmlTypeI32, 0, 4, one, base+1024))
		}},
		{"SET_ROWS wider than its destination", "ggml's constructor refuses its sources", func(base uint64) []byte {
			return wireFrame(wireSet, u64s(base, 256), f32s(64, 1))
		}, func(base uint64) []wireTensor {
			return rowsGraph(base, ggmlOpSetRows, shape(64, 1), typed(2, ggmlTypeI64, 0, 8, one, base+1024))
		}},
		{"SET at a negative offset", "ggml's constructor refuses its sources", func(base uint64) []byte {
			return wireFrame(wireSet, u64s(base, 8), f32s(2, 1))
		}, func(base uint64) []wireTensor {
			set := typed(3, 0, ggmlOpSet, 4, shape(4, 1), base+canaryOffset+canaryLength-16, 2, 1)
			set.opParams = [16]int32{4000, 4000, 4000, -4000}
			return []wireTensor{typed(1, 0, 0, 4, shape(1, 2), base), typed(2, 0, 0, 4, shape(4, 1), base+64), set}
		}},
		{"SET past its destination's end", "a view of 36 bytes into a destination of 32", func(base uint64) []byte {
			return wireFrame(wireSet, u64s(base, 8), f32s(2, 1))
		}, func(base uint64) []wireTensor {
			set := typed(3, 0, ggmlOpSet, 4, shape(8, 1), base+attackNodeAddr, 2, 1)
			set.opParams = [16]int32{32, 32, 32, 0}
			return []wireTensor{typed(1, 0, 0, 4, shape(1, 2), base), typed(2, 0, 0, 4, shape(8, 1), base+64), set}
		}},
	}
}
