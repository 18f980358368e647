package e2e

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fuzzBase marks an address in a fuzz input: an 8-byte little-endian word whose high
// half is fuzzBaseMark is replaced by the base of the session's buffer plus its low
// half, so that inputs reach the worker's memory (an attacker learns the base from
// ALLOC's answer).
const (
	fuzzBaseMark = 0xba5eba5e
	fuzzBufBytes = 1 << 16
)

func fuzzAddr(off uint32) uint64 { return fuzzBaseMark<<32 | uint64(off) }

// rebase replaces the marked words of b with base plus their offset.
func rebase(b []byte, base uint64) []byte {
	b = bytes.Clone(b)
	for i := 0; i+8 <= len(b); i++ {
		if binary.LittleEndian.Uint32(b[i+4:]) == fuzzBaseMark {
			binary.LittleEndian.PutUint64(b[i:], base+uint64(binary.LittleEndian.Uint32(b[i:])))
			i += 7
		}
	}
	return b
}

// FuzzWorkerProtocol sends a real worker (started with a secret) whatever frames the
// fuzzer makes, after the secret, an honest greeting and the allocation of a 64 KiB
// buffer, as a holder of the secret could. Each input must end with the worker's
// answers and the link closed within 30 s, and the worker must then greet the next
// session. The one way it may end is one of ggml's own assertions in a kernel (a row
// index out of range: an abort before the access, docs/security.md says so; a
// constructor's assertion is a refusal); a crash by any other signal, a hang or an
// exit is a failure. hack/fuzz.sh runs it again with a worker built with
// AddressSanitizer (FUZZ_ASAN), whose report of a read or write outside an allocation
// ends the worker other than by an assertion. The seeds (run by go test) are a
// runner's commands, graphs within the buffer, and the attacks of the
// TestAttackSplitWorker tests.
func FuzzWorkerProtocol(f *testing.F) {
	dup := f32Rows(2, ggmlOpDup, 4, fuzzAddr(64), 1)
	custom := f32Rows(2, ggmlOpMapCustom1, 4, fuzzAddr(64), 1)
	custom.opParams[0], custom.opParams[1], custom.opParams[2] = 0x41414141, 0x41414141, 1
	wrap := wireTensor{id: 1, ne: [4]int64{1, 2, 2, 1}, nb: [4]uint64{4, 1<<64 - 4096, 4160, 8192}, data: fuzzAddr(0)}
	for _, seed := range [][]byte{
		wireFrame(wireSet, u64s(fuzzAddr(0), 8), []byte("12345678")),
		append(wireFrame(wireGet, u64s(fuzzAddr(8), 16)), wireFrame(wireStatus)...),
		wireFrame(wireCompute, wireGraph([]wireTensor{f32Rows(1, 0, 4, fuzzAddr(0)), dup}, []uint32{1}, 0)),
		wireFrame(wireCompute, wireGraph([]wireTensor{f32Rows(1, 0, 4, fuzzAddr(0)), custom}, []uint32{1}, 0)),
		wireFrame(wireCompute, wireGraph([]wireTensor{wrap, f32Rows(2, ggmlOpCpy, 4, fuzzAddr(16384), 1, 3),
			f32Rows(3, 0, 4, fuzzAddr(16384))}, []uint32{1}, 0)),
		wireFrame(wireCompute, wireGraph(nil, nil, 1<<31)),
		wireFrame(wireAlloc, u64s(1<<40)),
		wireFrame(wireAwait, u64s(1, fuzzAddr(0), 8)),
		{0, 0, 0, 0x60, wireSet},
	} {
		f.Add(seed)
	}
	for _, a := range nodeAttacks() {
		f.Add(a.frames(fuzzAddr(0)))
	}
	w := startAttackWorker(f)
	f.Fuzz(func(t *testing.T, frames []byte) {
		select {
		case <-w.exited: // an earlier input's tolerated abort
			w = startAttackWorker(t)
		default:
		}
		c, _ := w.session(t, make([]byte, 16))
		base := c.alloc(fuzzBufBytes)
		if _, err := c.conn.Write(append(rebase(frames, base), wireFrame(wireStatus)...)); err != nil && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("sending: %v", err)
		}
		_ = c.conn.(*net.TCPConn).CloseWrite()
		_ = c.conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.Copy(io.Discard, c.conn); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("the worker neither answered nor closed the link within 30 s: %v", err)
		}
		c.conn.Close()
		// A worker that greets a new session lives. A connection alone does not tell:
		// a dying worker's listener can outlive its link by a moment, and the kernel
		// completes a connection to it (seen in 1 of 8 tries).
		probe := w.greets(t)
		if probe == nil {
			return
		}
		select {
		case <-w.exited:
		case <-time.After(10 * time.Second):
			t.Fatalf("the worker greets no session (%v) but it has not exited; stderr:\n%s", probe, tail(w.stderr.String(), 2000))
		}
		if !abortedByGGML(w.cmd.ProcessState.Sys().(syscall.WaitStatus), w.stderr.String()) {
			t.Fatalf("the worker ended (%v) other than by one of ggml's assertions; stderr:\n%s", w.cmd.ProcessState, tail(w.stderr.String(), 3000))
		}
		t.Logf("an assertion of ggml ended the worker: %s", assertionLine(w.stderr.String()))
	})
}

// abortedByGGML: the worker ended by the abort of one of ggml's assertions. Where the
// assertion fails decides how the process ends: on one of ggml's own threads, the
// abort kills it with SIGABRT; on a thread running Go's cgo call (one compute thread
// does), Go's runtime takes the signal, writes "SIGABRT: abort" with its goroutines,
// and exits with status 2.
func abortedByGGML(st syscall.WaitStatus, stderr string) bool {
	if !strings.Contains(stderr, "GGML_ASSERT") {
		return false
	}
	if st.Signaled() {
		return st.Signal() == syscall.SIGABRT
	}
	return st.Exited() && st.ExitStatus() == 2 && strings.Contains(stderr, "\nSIGABRT: abort\n")
}

// assertionLine is the line of stderr that names ggml's failed assertion.
func assertionLine(stderr string) string {
	for line := range strings.Lines(stderr) {
		if strings.Contains(line, "GGML_ASSERT") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
