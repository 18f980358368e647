package splitlink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

func testFrame(cmd byte, payload []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(payload)))
	return append(append(b, cmd), payload...)
}

func le64(vs ...uint64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

func graphHeader(nTensors, nNodes, nChanged, nodesSent, stream uint32) []byte {
	var b []byte
	for _, v := range []uint32{nTensors, nNodes, nChanged, nodesSent, stream, 0} {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return append(b, make([]byte, 8)...)
}

// TestCheckFrame: each command a runner sends passes at its exact size or the size
// its fields account for; a size, count or extent beyond its bound, a command a
// runner never sends, or anything but a greeting first is refused with the reason.
func TestCheckFrame(t *testing.T) {
	const mem = 1 << 30
	for _, tc := range []struct {
		name    string
		cmd     byte
		size    uint32
		prefix  []byte
		greeted bool
		want    string // "" passes
	}{
		{"the greeting", cmdHello, helloBytes, nil, false, ""},
		{"a greeting of another size", cmdHello, 64, nil, false, "not 56"},
		{"a first frame of 2 GiB", cmdHello, 1 << 31, nil, false, "not 56"},
		{"anything else first", cmdStatus, 0, nil, false, "must be the greeting"},
		{"a second greeting", cmdHello, helloBytes, nil, true, "a second greeting"},
		{"an allocation within the shard", cmdAlloc, 8, le64(mem), true, ""},
		{"an allocation beyond it", cmdAlloc, 8, le64(mem + 1), true, "beyond the shard's"},
		{"an empty allocation", cmdAlloc, 8, le64(0), true, "beyond the shard's"},
		{"a write", cmdSet, 16 + 100, le64(4096, 100), true, ""},
		{"a write whose size disagrees", cmdSet, 16 + 100, le64(4096, 99), true, "a write of 99 bytes"},
		{"a write beyond the shard", cmdSet, 16 + 3<<29, le64(4096, 3<<29), true, "beyond 1073741840"},
		{"a write of more than its frame holds", cmdSet, 16 + 100, le64(4096, 1<<40), true, "a write of"},
		{"a write shorter than its header", cmdSet, 8, le64(4096), true, "shorter than its 16-byte header"},
		{"a read beyond the bound", cmdGet, 16, le64(4096, MaxTransferBytes+1), true, "a read of"},
		{"a copy", cmdCopy, 24, le64(1, 2, 3), true, ""},
		{"a push beyond the bound", cmdPush, 24, le64(1, 2, 1<<40), true, "a transfer of"},
		{"a weight write of another size", cmdSetFile, 95, nil, true, "not 96"},
		{"status", cmdStatus, 0, nil, true, ""},
		{"status with a payload", cmdStatus, 4, nil, true, "not 0"},
		{"a graph", cmdCompute, 32 + 2*260 + 3*4, graphHeader(5, 3, 2, 1, 0), true, ""},
		{"a graph repeating its nodes", cmdCompute, 32 + 2*260, graphHeader(5, 3, 2, 0, 63), true, ""},
		{"a graph whose size disagrees", cmdCompute, 32 + 260, graphHeader(5, 3, 2, 1, 0), true, "not 564"},
		{"a graph of 2^31 tensors", cmdCompute, 32 + 260, graphHeader(1<<31, 1, 1, 0, 0), true, "beyond 262144"},
		{"a graph frame beyond any graph", cmdCompute, 1 << 31, graphHeader(1, 1, 1, 0, 0), true, "beyond"},
		{"a graph changing more than it has", cmdCompute, 32 + 3*260, graphHeader(2, 1, 3, 0, 0), true, "changing 3 of its 2"},
		{"a stream beyond the bound", cmdCompute, 32, graphHeader(0, 0, 0, 0, 64), true, "stream 64"},
		{"a peer greeting on a runner's link", runnerapiPeerHello, 16, nil, true, "not a command"},
		{"an unknown command", 99, 0, nil, true, "not a command"},
	} {
		err := CheckFrame(tc.cmd, tc.size, tc.prefix, tc.greeted, mem)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

const runnerapiPeerHello = 14

// TestGuard: good frames stream through byte for byte; the first bad one ends the
// copy before a byte of it is written, with a *FrameError.
func TestGuard(t *testing.T) {
	good := append(testFrame(cmdHello, make([]byte, helloBytes)), testFrame(cmdSet, append(le64(0, 5000), make([]byte, 5000)...))...)
	bad := append(binary.LittleEndian.AppendUint32(nil, 16+1<<30+1), cmdSet)
	var out bytes.Buffer
	err := Guard(&out, bytes.NewReader(append(append([]byte(nil), good...), bad...)), 0)
	var fe *FrameError
	if !errors.As(err, &fe) || fe.Command != cmdSet || !bytes.Equal(out.Bytes(), good) {
		t.Fatalf("Guard = %v with %d bytes out, want a refused SET after the %d good bytes", err, out.Len(), len(good))
	}
	out.Reset()
	if err := Guard(&out, bytes.NewReader(good), 0); err != nil || !bytes.Equal(out.Bytes(), good) {
		t.Fatalf("Guard of good frames = %v with %d of %d bytes out", err, out.Len(), len(good))
	}
	out.Reset()
	push := testFrame(0, append(le64(7), "bytes"...))
	if err := GuardPushes(&out, bytes.NewReader(push)); err != nil || !bytes.Equal(out.Bytes(), push) {
		t.Fatalf("GuardPushes of a push = %v", err)
	}
	if err := GuardPushes(io.Discard, bytes.NewReader(testFrame(2, le64(7)))); !errors.As(err, &fe) {
		t.Fatalf("GuardPushes of status 2 = %v, want refused", err)
	}
}

// FuzzGuard feeds arbitrary bytes to the guard as the head's Mac could: it must never
// panic, never write more than it read, and every frame it let through must pass
// CheckFrame when read back; a refusal must be a *FrameError or a short read.
func FuzzGuard(f *testing.F) {
	f.Add(append(testFrame(cmdHello, make([]byte, helloBytes)), testFrame(cmdSet, append(le64(0, 3), 1, 2, 3))...), uint64(0))
	f.Add(append(testFrame(cmdHello, make([]byte, helloBytes)), testFrame(cmdCompute, append(graphHeader(2, 1, 1, 1, 0), make([]byte, 264)...))...), uint64(1<<20))
	f.Add(append(testFrame(cmdHello, make([]byte, helloBytes)), testFrame(cmdAlloc, le64(1<<40))...), uint64(1<<30))
	f.Add([]byte{0, 0, 0, 0x80, cmdHello}, uint64(0))
	f.Fuzz(func(t *testing.T, data []byte, memory uint64) {
		var out bytes.Buffer
		err := Guard(&out, bytes.NewReader(data), memory)
		if out.Len() > len(data) {
			t.Fatalf("wrote %d bytes of %d read", out.Len(), len(data))
		}
		var fe *FrameError
		if err != nil && !errors.As(err, &fe) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			t.Fatalf("Guard = %v, want a *FrameError or a short read", err)
		}
		// What passed, read back frame by frame: each passes, at its full length
		// (the last possibly cut by the end of the input).
		b, greeted := out.Bytes(), false
		for len(b) >= 5 {
			size, cmd := binary.LittleEndian.Uint32(b), b[4]
			n := min(prefixBytes(cmd), int(min(size, graphHeaderBytes)), len(b)-5)
			if n == min(prefixBytes(cmd), int(min(size, graphHeaderBytes))) {
				if err := CheckFrame(cmd, size, b[5:5+n], greeted, memory); err != nil {
					t.Fatalf("a frame that passed fails CheckFrame: %v", err)
				}
			}
			greeted = true
			b = b[min(len(b), 5+int(size)):]
		}
	})
}
