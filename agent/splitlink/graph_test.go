package splitlink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// record is a graph record: index, then an mfnd_tensor of type typ and op, extents ne0.
func record(index uint32, typ, op int32, ne0 int64) []byte {
	r := make([]byte, graphRecordBytes)
	binary.LittleEndian.PutUint32(r, index)
	binary.LittleEndian.PutUint32(r[tensorType:], uint32(typ))
	binary.LittleEndian.PutUint32(r[tensorOp:], uint32(op))
	binary.LittleEndian.PutUint64(r[tensorExtent:], uint64(ne0))
	return r
}

// graphFrame is a COMPUTE of nTensors tensors with recs changed and nodes sent.
func graphFrame(nTensors uint32, nodes []uint32, recs ...[]byte) []byte {
	p := graphHeader(nTensors, uint32(len(nodes)), uint32(len(recs)), 1, 0)
	for _, r := range recs {
		p = append(p, r...)
	}
	for _, n := range nodes {
		p = binary.LittleEndian.AppendUint32(p, n)
	}
	return testFrame(cmdCompute, p)
}

// TestGuardGraphs: a graph's records and nodes pass when they name types ggml has,
// inference ops and indexes within the graph; a custom op (a function pointer in its
// op params), a training op, an unknown op or type, a negative extent, an index or a
// node past the graph are refused before a byte of the frame is written.
func TestGuardGraphs(t *testing.T) {
	hello := testFrame(cmdHello, make([]byte, helloBytes))
	const mulMat, glu, f32, q4k = 31, ggmlOpGLU, 0, 12
	for _, tc := range []struct {
		name  string
		frame []byte
		want  string
	}{
		{"a graph of inference ops", graphFrame(3, []uint32{1, 2}, record(0, f32, 0, 4096), record(1, q4k, mulMat, 4096), record(2, f32, glu, 1)), ""},
		{"many records, past a chunk", graphFrame(600, []uint32{599}, func() [][]byte {
			var rs [][]byte
			for i := range 600 {
				rs = append(rs, record(uint32(i), f32, 0, 1))
			}
			return rs
		}()...), ""},
		{"a custom op", graphFrame(2, nil, record(0, f32, 0, 1), record(1, f32, ggmlOpMapCustom1, 1)), "op 86"},
		{"the custom op", graphFrame(1, nil, record(0, f32, 89, 1)), "op 89"},
		{"a training op", graphFrame(1, nil, record(0, f32, 92, 1)), "op 92"},
		{"an unknown op", graphFrame(1, nil, record(0, f32, 1000, 1)), "op 1000"},
		{"a negative op", graphFrame(1, nil, record(0, f32, -1, 1)), "op -1"},
		{"a type ggml dropped", graphFrame(1, nil, record(0, 4, 0, 1)), "tensor type 4"},
		{"an unknown type", graphFrame(1, nil, record(0, 40, 0, 1)), "tensor type 40"},
		{"a negative extent", graphFrame(1, nil, record(0, f32, 0, -5)), "negative extent"},
		{"an index past the graph", graphFrame(2, nil, record(2, f32, 0, 1)), "tensor index 2"},
		{"a node past the graph", graphFrame(2, []uint32{0, 7}, record(0, f32, 0, 1)), "node 7"},
	} {
		var out bytes.Buffer
		in := append(append([]byte(nil), hello...), tc.frame...)
		err := Guard(&out, bytes.NewReader(in), 0)
		if tc.want == "" {
			if err != nil || !bytes.Equal(out.Bytes(), in) {
				t.Errorf("%s: %v, %d of %d bytes through; want all", tc.name, err, out.Len(), len(in))
			}
			continue
		}
		var fe *FrameError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want refused: %q", tc.name, err, tc.want)
		}
		// A graph that fits one chunk is checked whole before a byte of it is written.
		if out.Len() != len(hello) {
			t.Errorf("%s: %d bytes through, want only the greeting's %d", tc.name, out.Len(), len(hello))
		}
	}
}

// TestGGMLNumbering: the guard's ggml numbers are the vendored ggml.h's: the first
// custom op, GLU, the op count, the type count and the types ggml no longer defines.
func TestGGMLNumbering(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ollama/ollama").Output()
	if err != nil {
		t.Fatalf("finding the vendored ggml: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "ml", "backend", "ggml", "ggml", "include", "ggml.h"))
	if err != nil {
		t.Fatal(err)
	}
	h := string(b)
	ops := regexp.MustCompile(`GGML_OP_[A-Z0-9_]+`).FindAllString(h[strings.Index(h, "enum ggml_op {"):][:strings.Index(h[strings.Index(h, "enum ggml_op {"):], "};")], -1)
	at := map[string]int{}
	for i, op := range ops {
		at[op] = i
	}
	if at["GGML_OP_MAP_CUSTOM1"] != ggmlOpMapCustom1 || at["GGML_OP_GLU"] != ggmlOpGLU || at["GGML_OP_COUNT"] != ggmlOpCount ||
		at["GGML_OP_CUSTOM"] != ggmlOpMapCustom1+3 || at["GGML_OP_OPT_STEP_SGD"] != ggmlOpGLU-1 {
		t.Errorf("ggml.h numbers MAP_CUSTOM1 %d, CUSTOM %d, OPT_STEP_SGD %d, GLU %d, COUNT %d; the guard has %d, %d, %d, %d, %d",
			at["GGML_OP_MAP_CUSTOM1"], at["GGML_OP_CUSTOM"], at["GGML_OP_OPT_STEP_SGD"], at["GGML_OP_GLU"], at["GGML_OP_COUNT"],
			ggmlOpMapCustom1, ggmlOpMapCustom1+3, ggmlOpGLU-1, ggmlOpGLU, ggmlOpCount)
	}
	defined := map[int32]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s*GGML_TYPE_[A-Z0-9_]+\s*=\s*(\d+)`).FindAllStringSubmatch(h, -1) {
		n, _ := strconv.Atoi(m[1])
		defined[int32(n)] = true
	}
	for typ := int32(0); typ <= ggmlTypeCount; typ++ {
		want := defined[typ] && typ != ggmlTypeCount
		if got := typ < ggmlTypeCount && !ggmlTypeGone[typ]; got != want {
			t.Errorf("type %d: the guard allows it %v, ggml.h defines it %v", typ, got, want)
		}
	}
}
