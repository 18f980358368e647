package e2e

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"
)

// wireTensor is one graph record (wire.h, mfnd_tensor), as an attacker fills it.
type wireTensor struct {
	id       uint64
	typ, op  int32
	ne       [4]int64
	nb       [4]uint64
	opParams [16]int32
	src      [10]uint64
	data     uint64
}

func (r wireTensor) bytes() []byte {
	b := make([]byte, wireTensorSize)
	le := binary.LittleEndian
	le.PutUint64(b[0:], r.id)
	le.PutUint32(b[8:], uint32(r.typ))
	le.PutUint32(b[12:], uint32(r.op))
	for k := range 4 {
		le.PutUint64(b[24+8*k:], uint64(r.ne[k]))
		le.PutUint64(b[56+8*k:], r.nb[k])
	}
	for k, p := range r.opParams {
		le.PutUint32(b[88+4*k:], uint32(p))
	}
	for k, s := range r.src {
		le.PutUint64(b[152+8*k:], s)
	}
	le.PutUint64(b[248:], r.data)
	return b
}

// f32Rows is a contiguous F32 tensor of n floats at data, computed by op from srcs.
func f32Rows(id uint64, op int32, n int64, data uint64, srcs ...uint64) wireTensor {
	r := wireTensor{id: id, typ: 0, op: op, ne: [4]int64{n, 1, 1, 1}, nb: [4]uint64{4, uint64(4 * n), uint64(4 * n), uint64(4 * n)}, data: data}
	copy(r.src[:], srcs)
	return r
}

// wireGraph is a COMPUTE payload replacing stream 0's graph with tensors, whose nodes
// are the indexes nodes; nTensors overrides the count when not 0.
func wireGraph(tensors []wireTensor, nodes []uint32, nTensors uint32) []byte {
	if nTensors == 0 {
		nTensors = uint32(len(tensors))
	}
	le := binary.LittleEndian
	h := make([]byte, 32)
	le.PutUint32(h[0:], nTensors)
	le.PutUint32(h[4:], uint32(len(nodes)))
	le.PutUint32(h[8:], uint32(len(tensors)))
	le.PutUint32(h[12:], 1)
	var b bytes.Buffer
	b.Write(h)
	for i, r := range tensors {
		b.Write(le.AppendUint32(nil, uint32(i)))
		b.Write(r.bytes())
	}
	for _, n := range nodes {
		b.Write(le.AppendUint32(nil, n))
	}
	return b.Bytes()
}

// ggml's numbers (the vendored ggml.h) the attacks use.
const (
	ggmlOpDup        = 1
	ggmlOpAdd        = 2
	ggmlOpCpy        = 34
	ggmlOpMapCustom1 = 86
	ggmlOpOptStepSGD = 93
)

// TestAttackSplitWorkerRunsCraftedGraphs: a process holding a worker's secret (the
// head Mac's runner, compromised, or anything that took the secret) greets the worker
// as a runner and sends it graphs no llama.cpp graph is: a custom op whose op params
// are a function pointer (the worker's backend calls it), a training op, a type and an
// op number ggml does not define (read past its tables; ggml_new_tensor asserts),
// strides whose byte extent wraps around 2^64 to a few bytes inside a buffer while
// rows lie 4 KiB before it, a node missing its source, and a graph claiming 2^31
// tensors. On main the worker built and computed them: it called the address, aborted,
// read outside its buffers or ran out of memory, and the process died. Now each is
// answered with an error naming what is refused, the worker lives on, and an honest
// runner loads and answers after the last. Without the secret the same frames are closed
// unanswered.
func TestAttackSplitWorkerRunsCraftedGraphs(t *testing.T) {
	const buf = 1 << 16
	custom := f32Rows(2, ggmlOpMapCustom1, 4, 0, 1)
	// ggml_map_custom1_op_params: the function, n_tasks, userdata.
	custom.opParams[0], custom.opParams[1], custom.opParams[2] = 0x41414141, 0x41414141, 1
	badType := f32Rows(2, ggmlOpDup, 4, 0, 1)
	badType.typ = 99
	badOp := f32Rows(2, 200, 4, 0, 1)
	// A strided view: a row 4 KiB before the buffer and one 4,160 bytes in, whose
	// extent (ggml_nbytes) wraps to 68 bytes.
	wrap := wireTensor{id: 1, typ: 0, op: 0, ne: [4]int64{1, 2, 2, 1}, nb: [4]uint64{4, 1<<64 - 4096, 4160, 8192}}
	cases := []struct {
		name, want string
		graph      func(base uint64) []byte
	}{
		{"a custom op calling an address", "not one of a llama graph's", func(base uint64) []byte {
			c := custom
			c.data = base + 64
			return wireGraph([]wireTensor{f32Rows(1, 0, 4, base), c}, []uint32{1}, 0)
		}},
		{"a training op", "not one of a llama graph's", func(base uint64) []byte {
			return wireGraph([]wireTensor{f32Rows(1, 0, 4, base), f32Rows(2, ggmlOpOptStepSGD, 4, base+64, 1)}, []uint32{1}, 0)
		}},
		{"an undefined type", "does not define", func(base uint64) []byte {
			b := badType
			b.data = base + 64
			return wireGraph([]wireTensor{f32Rows(1, 0, 4, base), b}, []uint32{1}, 0)
		}},
		{"an undefined op", "not one of a llama graph's", func(base uint64) []byte {
			b := badOp
			b.data = base + 64
			return wireGraph([]wireTensor{f32Rows(1, 0, 4, base), b}, []uint32{1}, 0)
		}},
		{"strides wrapping around", "overflows", func(base uint64) []byte {
			v := wrap
			v.data = base
			return wireGraph([]wireTensor{v, {id: 2, typ: 0, op: ggmlOpCpy, ne: v.ne, nb: [4]uint64{4, 4, 8, 16},
				src: [10]uint64{1, 3}, data: base + 16384}, f32Rows(3, 0, 4, base+16384)}, []uint32{1}, 0)
		}},
		{"a tensor past its buffer", "the worker's buffers", func(base uint64) []byte {
			return wireGraph([]wireTensor{f32Rows(1, 0, 4, base), f32Rows(2, ggmlOpDup, 64, base+buf-64, 1)}, []uint32{1}, 0)
		}},
		{"a node missing its source", "is not a tensor of the graph", func(base uint64) []byte {
			return wireGraph([]wireTensor{f32Rows(1, 0, 4, base), f32Rows(2, ggmlOpAdd, 4, base+64, 1)}, []uint32{1}, 0)
		}},
		{"2^31 tensors", "bounds on tensors and nodes", func(base uint64) []byte {
			return wireGraph(nil, nil, 1<<31)
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A worker of its own, so that each attack shows what it alone does.
			w := startAttackWorker(t)
			c, _ := w.session(t, make([]byte, 16))
			base := c.alloc(buf)
			c.send(wireFrame(wireCompute, tc.graph(base)))
			c.refused(tc.name, tc.want)
			c.conn.Close()
			w.withoutSecret(t, wireFrame(wireCompute, tc.graph(0x10000)))
			w.alive(t, tc.name)
			if i == len(cases)-1 {
				w.servesAnHonestRunner(t)
			}
		})
	}
}

// TestAttackSplitWorkerMemory: an attacker holding the secret allocates past the
// worker's --memory (its shard's reservation on the Mac): on main ALLOC took any size
// the allocator gave, so one session could take the Mac's memory. And it reads what a
// previous session left: on main a new buffer held the bytes of the last session's
// freed one (another runner's weights, KV cache: its prompts). Now an allocation past
// --memory, alone or with the others, is refused with an error naming it, a freed one
// makes room again, and a new buffer reads back zeros.
func TestAttackSplitWorkerMemory(t *testing.T) {
	w := startAttackWorker(t, "--memory", fmt.Sprint(64<<20))
	c, reply := w.session(t, make([]byte, 16))
	if total := binary.LittleEndian.Uint64(reply[16:]); total != 64<<20 {
		t.Fatalf("the worker answered %d bytes of memory, want its --memory", total)
	}
	c.send(wireFrame(wireAlloc, u64s(256<<20)))
	c.refused("an allocation of 4x --memory", "(--memory) are allocated")
	var bases []uint64
	for range 3 {
		bases = append(bases, c.alloc(20<<20))
	}
	c.send(wireFrame(wireAlloc, u64s(20<<20)))
	c.refused("a fourth allocation of 20 MiB under 64 MiB", "(--memory) are allocated")
	c.send(wireFrame(wireFree, u64s(bases[0])))
	c.alloc(20 << 20)

	// A session writes a pattern in a buffer and leaves; the next allocates the same
	// size and reads it back.
	const n = 64 << 10
	pattern := bytes.Repeat([]byte{0xab}, n)
	c.conn.Close()
	c, _ = w.session(t, make([]byte, 16))
	base := c.alloc(n)
	c.send(wireFrame(wireSet, u64s(base, n), pattern), wireFrame(wireStatus))
	if status, p := c.read(10 * time.Second); status != 0 {
		t.Fatalf("writing the pattern: %q", p)
	}
	c.conn.Close()
	for i := range 3 {
		c, _ = w.session(t, make([]byte, 16))
		base = c.alloc(n)
		c.send(wireFrame(wireGet, u64s(base, n)))
		status, p := c.read(10 * time.Second)
		if status != 0 || len(p) != n {
			t.Fatalf("reading a new buffer: status %d, %d bytes", status, len(p))
		}
		if k := bytes.Count(p, []byte{0xab}); k > 0 || bytes.Count(p, []byte{0}) != n {
			t.Errorf("session %d: a new buffer holds %d bytes of the previous session's pattern (%d not zero)", i, k, n-bytes.Count(p, []byte{0}))
		}
		c.conn.Close()
	}
	w.withoutSecret(t, wireFrame(wireAlloc, u64s(256<<20)))
	w.alive(t, "the allocations")
}
