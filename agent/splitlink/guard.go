package splitlink

import (
	"encoding/binary"
	"fmt"
	"io"
)

// The worker protocol's request frames (metal/runner/netdevice/wire.h): a u32
// little-endian payload length, a command byte, the payload. The worker Mac's agent
// checks every frame the head's Mac sends before its worker reads a byte of it
// (Guard): only the commands a runner sends, each with its exact size or a size its
// own fields account for, counts and lengths within the bounds below, allocations
// within the shard's memory. The first bad frame ends the link; the worker never
// sees it, so its claimed size is never allocated.
const (
	cmdHello   = 1
	cmdAlloc   = 2
	cmdFree    = 3
	cmdClear   = 4
	cmdSet     = 5
	cmdSetFile = 6
	cmdGet     = 7
	cmdCopy    = 8
	cmdMemset  = 9
	cmdCompute = 10
	cmdStatus  = 11
	cmdPeer    = 12
	cmdAwait   = 13
	cmdPush    = 15

	// Fixed sizes of wire.h's structs.
	helloBytes       = 56  // mfnd_hello
	setFileBytes     = 96  // mfnd_set_file (GGML_MAX_NAME 64)
	graphHeaderBytes = 32  // mfnd_graph
	graphRecordBytes = 260 // u32 index + mfnd_tensor

	// MaxTransferBytes bounds the bytes one SET writes, one GET reads back and one
	// COPY, AWAIT or PUSH moves: far above a batch's activations (a 2,048-token
	// batch of a 16,384-wide model in f32 is 128 MiB), far below the frame's 2 GiB.
	MaxTransferBytes = 1 << 30
	// MaxGraphTensors bounds a graph's tensors and nodes: llama.cpp's graphs of the
	// largest models stay below 5 × their 30,000-odd weights.
	MaxGraphTensors = 1 << 18
	// maxStreams is wire.h's MFND_MAX_STREAMS.
	maxStreams = 64
)

// FrameError is a frame the guard refused, and why.
type FrameError struct {
	Command byte
	Size    uint32
	Reason  string
}

func (e *FrameError) Error() string {
	return fmt.Sprintf("refused a worker protocol frame (command %d, %d bytes): %s", e.Command, e.Size, e.Reason)
}

// refusal makes the *FrameError refusing a frame of cmd and size.
func refusal(cmd byte, size uint32) func(format string, args ...any) error {
	return func(format string, args ...any) error {
		return &FrameError{Command: cmd, Size: size, Reason: fmt.Sprintf(format, args...)}
	}
}

// prefixBytes is how much of a command's payload the guard reads before it decides:
// the fields that give its size, counts or extents.
func prefixBytes(cmd byte) int {
	switch cmd {
	case cmdAlloc:
		return 8
	case cmdSet, cmdGet:
		return 16
	case cmdCopy, cmdAwait, cmdPush:
		return 24
	case cmdCompute:
		return graphHeaderBytes
	}
	return 0
}

// fixedSize is the exact payload size of the commands that have one (-1: none).
func fixedSize(cmd byte) int64 {
	switch cmd {
	case cmdHello:
		return helloBytes
	case cmdAlloc, cmdFree:
		return 8
	case cmdClear:
		return 9
	case cmdSetFile:
		return setFileBytes
	case cmdGet, cmdPeer:
		return 16
	case cmdCopy, cmdAwait, cmdPush:
		return 24
	case cmdMemset:
		return 17
	case cmdStatus:
		return 0
	}
	return -1
}

// checkHeader decides what a frame's header alone can: the command, its order, its
// size against the command's exact size or greatest one.
func checkHeader(cmd byte, size uint32, greeted bool, memory uint64, bad func(string, ...any) error) error {
	if !greeted && cmd != cmdHello {
		return bad("the first frame must be the greeting (command %d)", cmdHello)
	}
	if greeted && cmd == cmdHello {
		return bad("a second greeting")
	}
	want, most := fixedSize(cmd), int64(-1)
	switch cmd {
	case cmdSet:
		most = 16 + int64(transferLimit(memory))
	case cmdCompute:
		most = graphHeaderBytes + MaxGraphTensors*(graphRecordBytes+4)
	}
	switch {
	case want < 0 && most < 0:
		return bad("not a command a runner sends its worker")
	case want >= 0 && int64(size) != want:
		return bad("its payload is %d bytes, not %d", size, want)
	case most >= 0 && int64(size) > most:
		return bad("its payload is %d bytes, beyond %d", size, most)
	case int(size) < prefixBytes(cmd):
		return bad("its payload is %d bytes, shorter than its %d-byte header", size, prefixBytes(cmd))
	}
	return nil
}

// transferLimit is the most bytes one command may move: MaxTransferBytes, and the
// shard's memory when known.
func transferLimit(memory uint64) uint64 {
	if memory > 0 {
		return min(MaxTransferBytes, memory)
	}
	return MaxTransferBytes
}

// CheckFrame decides one request frame from its command, its claimed payload size
// and the first prefixBytes(cmd) bytes of its payload (fewer when the size is
// smaller): nil, or why it is refused. greeted says whether the link's HELLO has
// passed; memory bounds an allocation and a transfer (0: only MaxTransferBytes).
func CheckFrame(cmd byte, size uint32, prefix []byte, greeted bool, memory uint64) error {
	bad := refusal(cmd, size)
	if err := checkHeader(cmd, size, greeted, memory, bad); err != nil {
		return err
	}
	if len(prefix) < prefixBytes(cmd) {
		return bad("only %d bytes of its %d-byte header were read", len(prefix), prefixBytes(cmd))
	}
	u64 := func(i int) uint64 { return binary.LittleEndian.Uint64(prefix[8*i:]) }
	limit := transferLimit(memory)
	switch cmd {
	case cmdAlloc:
		if n := u64(0); n == 0 || (memory > 0 && n > memory) {
			return bad("an allocation of %d bytes, beyond the shard's %d bytes of memory", n, memory)
		}
	case cmdSet:
		if n := u64(1); n > limit || uint64(size) != 16+n {
			return bad("a write of %d bytes in a payload of %d (at most %d bytes, and 16 more for its header)", n, size, limit)
		}
	case cmdGet:
		if n := u64(1); n > limit {
			return bad("a read of %d bytes, beyond %d", n, limit)
		}
	case cmdCopy, cmdAwait, cmdPush:
		if n := u64(2); n > limit {
			return bad("a transfer of %d bytes, beyond %d", n, limit)
		}
	case cmdCompute:
		return checkGraph(prefix, size, bad)
	}
	return nil
}

// checkGraph checks a COMPUTE's mfnd_graph header against its payload size.
func checkGraph(h []byte, size uint32, bad func(string, ...any) error) error {
	u32 := func(i int) uint64 { return uint64(binary.LittleEndian.Uint32(h[4*i:])) }
	nTensors, nNodes, nChanged, nodesSent, stream := u32(0), u32(1), u32(2), u32(3), u32(4)
	switch {
	case nTensors > MaxGraphTensors || nNodes > MaxGraphTensors:
		return bad("a graph of %d tensors and %d nodes, beyond %d", nTensors, nNodes, MaxGraphTensors)
	case nChanged > nTensors:
		return bad("a graph changing %d of its %d tensors", nChanged, nTensors)
	case stream >= maxStreams:
		return bad("stream %d, beyond %d", stream, maxStreams-1)
	}
	want := graphHeaderBytes + nChanged*graphRecordBytes
	if nodesSent != 0 {
		want += 4 * nNodes
	}
	if uint64(size) != want {
		return bad("a graph of %d changed tensors and %d nodes in %d bytes, not %d", nChanged, nNodes, size, want)
	}
	return nil
}

// Guard copies request frames from src to dst, each checked by CheckFrame before a
// byte of it is written, until src ends (nil) or a frame is refused (a *FrameError)
// or a copy fails. It holds at most a frame's header and prefix: a payload streams
// through.
func Guard(dst io.Writer, src io.Reader, memory uint64) error {
	var buf [5 + graphHeaderBytes]byte
	greeted := false
	for {
		if _, err := io.ReadFull(src, buf[:5]); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		size, cmd := binary.LittleEndian.Uint32(buf[:4]), buf[4]
		// What the header alone shows is refused before another byte is read.
		if err := checkHeader(cmd, size, greeted, memory, refusal(cmd, size)); err != nil {
			return err
		}
		n := min(prefixBytes(cmd), int(min(size, graphHeaderBytes)))
		if _, err := io.ReadFull(src, buf[5:5+n]); err != nil {
			return err
		}
		if err := CheckFrame(cmd, size, buf[5:5+n], greeted, memory); err != nil {
			return err
		}
		greeted = true
		if cmd == cmdCompute {
			if err := copyGraph(dst, src, buf[:5+n], size); err != nil {
				return err
			}
			continue
		}
		if _, err := dst.Write(buf[:5+n]); err != nil {
			return err
		}
		if _, err := io.CopyN(dst, src, int64(size)-int64(n)); err != nil {
			return err
		}
	}
}

// GuardPushes copies a peer link's frames from the previous worker (src) to this
// one (dst) once its greeting has passed: pushes, each a u32 length, a status byte
// (0: the bytes, 1: an error message) and a u64 sequence number first, of at most
// MaxTransferBytes. It returns as Guard does.
func GuardPushes(dst io.Writer, src io.Reader) error {
	var head [5]byte
	for {
		if _, err := io.ReadFull(src, head[:]); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		size, status := binary.LittleEndian.Uint32(head[:4]), head[4]
		if status > 1 || size < 8 || size > MaxTransferBytes+8 {
			return &FrameError{Command: status, Size: size,
				Reason: fmt.Sprintf("not a push (status 0 or 1, 8 to %d bytes)", MaxTransferBytes+8)}
		}
		if _, err := dst.Write(head[:]); err != nil {
			return err
		}
		if _, err := io.CopyN(dst, src, int64(size)); err != nil {
			return err
		}
	}
}
