//go:build cgo && !race

// Package netdevice splits a model's layers across processes (and Macs): a ggml
// backend device in the runner whose buffers and computation live in a worker process
// reached over TCP, and that worker (`macfleet-runner worker`). The runner keeps the
// tokenizer, sampling, the prompt cache, the first layers and the output layer; each
// worker holds its layers' weights, read from its own copy of the model file, and
// their KV cache, and computes them. docs/split-model.md describes the design, the
// protocol and the failure behaviour.
//
// The C++ sources implement ggml's device, buffer and backend interfaces
// (ggml-backend-impl.h of the vendored ggml); like metal/runner/llama, this package is only
// built into the runner binary and has no tests of its own (test/runner tests it
// through real processes).
package netdevice

/*
#cgo CXXFLAGS: -std=c++17
#include <stdlib.h>
#include "netdevice.h"
#include "ggml-backend.h"
*/
import "C"

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"github.com/macfleet/macfleet/api/runnerapi"

	// ggml itself (the symbols these sources call), as metal/runner/llama links it.
	_ "github.com/ollama/ollama/llama/llama.cpp/src"
)

const errLen = 1024

// Device is one worker seen as a ggml backend device. It lives as long as the process.
type Device struct {
	Addr string
	// Worker is the device the worker computes with, as it answered the greeting.
	Worker DeviceInfo
	dev    unsafe.Pointer
}

// Stats counts one device's traffic: bytes each way, answered round trips and graphs
// computed; Wait is the time spent in answered commands (sending, the worker's work,
// the answer), Compute the part of it the worker spent computing; Allocated the bytes
// of the worker's buffers the runner holds (weights, KV cache, compute); Memory the
// memory the worker answered as its own at the greeting (Serve's memory); Queue only
// in ThreadStats.
type Stats struct {
	BytesSent, BytesReceived, RoundTrips, Computes uint64
	Wait, Compute, Queue                           time.Duration
	Allocated, Memory                              uint64
	// PeerBytesSent is what the worker pushed straight to the next shard's worker
	// (framing included), as it reports it; Peer says its peer link to it is up. Not in
	// ThreadStats.
	PeerBytesSent uint64
	Peer          bool
}

// Connect dials a worker and greets it with the identity of modelPath (the worker
// refuses a different file); index names the device (NET0, NET1...). timeout bounds the
// dial and every later read and write on the link. A token (the head agent's split
// link's) is sent first, in runnerapi.SplitAuthFrame.
func Connect(ctx context.Context, addr string, token []byte, modelPath string, index int, timeout time.Duration) (*Device, error) {
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("split worker %s: %w", addr, err)
	}
	if token != nil {
		_ = conn.SetWriteDeadline(time.Now().Add(timeout))
		_, err = conn.Write(runnerapi.SplitAuthFrame(token))
		_ = conn.SetWriteDeadline(time.Time{})
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("split worker %s: sending the link's token: %w", addr, err)
		}
	}
	f, err := conn.(*net.TCPConn).File()
	conn.Close()
	if err != nil {
		return nil, fmt.Errorf("split worker %s: %w", addr, err)
	}
	defer f.Close()
	// The C side owns a duplicate of the socket and closes it.
	fd, err := dupFD(f)
	if err != nil {
		return nil, fmt.Errorf("split worker %s: %w", addr, err)
	}
	// The session's id: the previous worker's peer link must present it (Peer).
	session := make([]byte, 16)
	if _, err := rand.Read(session); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("split worker %s: %w", addr, err)
	}
	caddr, cpath := C.CString(addr), C.CString(modelPath)
	defer C.free(unsafe.Pointer(caddr))
	defer C.free(unsafe.Pointer(cpath))
	csession := C.CBytes(session)
	defer C.free(csession)
	buf := make([]byte, errLen)
	dev := C.mfnd_open(C.int(fd), caddr, C.int(index), cpath, C.int(timeout.Milliseconds()), (*C.uint8_t)(csession), cbuf(buf), errLen)
	if dev == nil {
		return nil, errors.New(goString(buf))
	}
	var typ C.int
	name := make([]byte, 64)
	C.mfnd_device_info(dev, &typ, cbuf(name), C.size_t(len(name)))
	go keepAlive(dev)
	return &Device{Addr: addr, Worker: DeviceInfo{Type: deviceTypeName(typ), Name: goString(name)}, dev: dev}, nil
}

// keepAlive keeps a device's link from idling out at its worker (--idle-timeout): a
// STATUS when it has been idle a third of that, until the link fails (a device lives
// as long as the process).
func keepAlive(dev unsafe.Pointer) {
	for {
		every := time.Duration(C.mfnd_keepalive(dev)) * time.Millisecond
		if every <= 0 || C.mfnd_error(dev, nil, 0) != 0 {
			return
		}
		time.Sleep(every / 4)
	}
}

// WorkerDevice is the device a worker computes with for choice; an error when there
// is none (a GPU asked for on a host without one). Call it after llama.Init.
func WorkerDevice(choice DeviceChoice) (DeviceInfo, error) {
	var typ C.int
	name := make([]byte, 64)
	buf := make([]byte, errLen)
	if C.mfnd_worker_device(choice.code(), &typ, cbuf(name), C.size_t(len(name)), cbuf(buf), errLen) != 0 {
		return DeviceInfo{}, errors.New(goString(buf))
	}
	return DeviceInfo{Type: deviceTypeName(typ), Name: goString(name)}, nil
}

// code is the choice's number in netdevice.h.
func (c DeviceChoice) code() C.int {
	switch c {
	case DeviceCPU:
		return C.MFND_DEVICE_CPU
	case DeviceGPU:
		return C.MFND_DEVICE_GPU
	}
	return C.MFND_DEVICE_AUTO
}

// deviceTypeName names an enum ggml_backend_dev_type value as ggml-backend.h does.
func deviceTypeName(t C.int) string {
	switch t {
	case C.GGML_BACKEND_DEVICE_TYPE_CPU:
		return "CPU"
	case C.GGML_BACKEND_DEVICE_TYPE_GPU:
		return "GPU"
	case C.GGML_BACKEND_DEVICE_TYPE_IGPU:
		return "IGPU"
	case C.GGML_BACKEND_DEVICE_TYPE_ACCEL:
		return "ACCEL"
	}
	return fmt.Sprintf("device type %d", int(t))
}

// DeviceChoice is the device a worker computes with (`macfleet-runner worker
// --device`).
type DeviceChoice string

const (
	// DeviceAuto is the first GPU ggml registered (Metal on Apple Silicon), else the
	// CPU.
	DeviceAuto DeviceChoice = "auto"
	// DeviceCPU is ggml's CPU device.
	DeviceCPU DeviceChoice = "cpu"
	// DeviceGPU is the first GPU ggml registered; a worker on a host without one fails.
	DeviceGPU DeviceChoice = "gpu"
)

// ParseDeviceChoice reads a --device value.
func ParseDeviceChoice(s string) (DeviceChoice, error) {
	switch c := DeviceChoice(s); c {
	case DeviceAuto, DeviceCPU, DeviceGPU:
		return c, nil
	}
	return "", fmt.Errorf("unknown device %q: want auto, cpu or gpu", s)
}

// DeviceInfo is a ggml device a worker computes with: its type (CPU, GPU, IGPU,
// ACCEL) and its name in ggml ("CPU", "Metal").
type DeviceInfo struct {
	Type string
	Name string
}

// HasNext says whether the worker was started with --next: it can push the hidden
// state after its layers straight to the next shard's worker (Peer).
func (d *Device) HasNext() bool { return C.mfnd_has_next(d.dev) != 0 }

// Peer asks the worker to open its peer link to next's worker, which must be the one
// its --next reaches: next's worker accepts it only with the session id its runner gave
// it. From then on the hidden state between them goes over that link, not through the
// runner. An error fails the link.
func (d *Device) Peer(next *Device) error {
	buf := make([]byte, errLen)
	if C.mfnd_peer(d.dev, next.dev, cbuf(buf), errLen) != 0 {
		return errors.New(goString(buf))
	}
	return nil
}

// Handle is the ggml_backend_dev_t to pass to llama.cpp's model parameters.
func (d *Device) Handle() unsafe.Pointer { return d.dev }

// Check asks the worker for the first error of the commands it has not answered yet
// (after a load: a weight whose bytes differ from the runner's file).
func (d *Device) Check() error {
	buf := make([]byte, errLen)
	if C.mfnd_check(d.dev, cbuf(buf), errLen) != 0 {
		return errors.New(goString(buf))
	}
	return nil
}

// Err is the link's failure, nil while it works. Once set it stays: the worker died,
// the link was cut or timed out, or the worker reported an error.
func (d *Device) Err() error {
	buf := make([]byte, errLen)
	if C.mfnd_error(d.dev, cbuf(buf), errLen) != 0 {
		return errors.New(goString(buf))
	}
	return nil
}

// Stats returns the device's traffic so far.
func (d *Device) Stats() Stats {
	var s C.mfnd_stats
	C.mfnd_get_stats(d.dev, &s)
	return Stats{BytesSent: uint64(s.sent), BytesReceived: uint64(s.received),
		RoundTrips: uint64(s.round_trips), Computes: uint64(s.computes),
		Wait: time.Duration(s.wait_ns), Compute: time.Duration(s.compute_ns), Allocated: uint64(s.allocated),
		Memory: uint64(s.memory), PeerBytesSent: uint64(s.peer_sent), Peer: s.peer != 0}
}

// ThreadStats returns what the calling OS thread's commands cost so far, summed over
// every device: Queue is the time it waited for another thread's command to leave a
// link free (a pipelined runner's other context); Allocated and Memory are zero. The
// caller keeps to one thread (runtime.LockOSThread) for the figures to be its own.
func ThreadStats() Stats {
	var s C.mfnd_thread_stats
	C.mfnd_get_thread_stats(&s)
	return Stats{BytesSent: uint64(s.sent), BytesReceived: uint64(s.received),
		RoundTrips: uint64(s.round_trips), Computes: uint64(s.computes),
		Wait: time.Duration(s.wait_ns), Compute: time.Duration(s.compute_ns), Queue: time.Duration(s.queue_ns)}
}

// PeerHello is the command of a peer link's first frame (wire.h, MFND_PEER_HELLO) and
// the size of the session id it carries, which an agent checks on a peer link before
// it reaches its worker (runnerapi.SplitPeerHello, SplitPeerSessionBytes; test/runner
// TestSplitWorkerRefusesAStrangersPeerLink greets a real worker with those).
func PeerHello() (command, sessionBytes int) {
	var n C.int
	command = int(C.mfnd_peer_hello(&n))
	return command, int(n)
}

// IsPeerLink waits up to timeout for a new connection's first frame and says whether
// it opens a previous worker's peer link (AcceptPeer) rather than a runner's session
// (Serve); it reads nothing.
func IsPeerLink(conn *net.TCPConn, timeout time.Duration) (bool, error) {
	f, err := conn.File()
	if err != nil {
		return false, err
	}
	defer f.Close()
	fd, err := dupFD(f)
	if err != nil {
		return false, err
	}
	defer syscall.Close(fd)
	cmd := C.mfnd_peek(C.int(fd), C.int(timeout.Milliseconds()))
	if cmd < 0 {
		return false, fmt.Errorf("nothing sent within %v", timeout)
	}
	hello, _ := PeerHello()
	return int(cmd) == hello, nil
}

// AcceptPeer hands a previous worker's peer link to the runner session being served,
// if the link presents that session's id; else it refuses it, saying why to the
// previous worker and in the error. It closes conn.
func AcceptPeer(conn *net.TCPConn) error {
	f, fd, err := take(conn)
	if err != nil {
		return err
	}
	defer f.Close()
	buf := make([]byte, errLen)
	if C.mfnd_peer_accept(C.int(fd), cbuf(buf), errLen) != 0 {
		return errors.New(goString(buf))
	}
	return nil
}

// Serve serves one runner on conn until it disconnects or ctx ends, computing with
// choice's device (WorkerDevice; threads CPU threads when it is the CPU) and answering
// memory bytes as its free and total memory (0: the device's: the CPU's is the Mac's
// physical memory); next is the address of the next shard's worker (--next, "" for
// none), which it dials when the runner asks; idle ends a session without a command
// for that long (0: never; a runner's device keeps its link alive). It closes conn. When ctx ends Serve
// shuts the connection down: the worker finishes the command it is computing, frees
// its buffers and returns, and the runner sees its worker lost.
func Serve(ctx context.Context, conn *net.TCPConn, modelPath string, choice DeviceChoice, threads int, memory int64, next string,
	idle time.Duration) error {
	f, fd, err := take(conn)
	if err != nil {
		return err
	}
	defer f.Close()
	// f stays open until the session has ended, so shutting the socket down through
	// it never reaches a descriptor the C side has closed and the kernel reused.
	served := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-ctx.Done():
			shutdown(f)
		case <-served:
		}
	}()
	defer func() {
		close(served)
		<-stopped
	}()
	cpath, cnext := C.CString(modelPath), C.CString(next)
	defer C.free(unsafe.Pointer(cpath))
	defer C.free(unsafe.Pointer(cnext))
	buf := make([]byte, errLen)
	if C.mfnd_serve(C.int(fd), cpath, choice.code(), C.int(threads), C.uint64_t(max(memory, 0)), cnext, C.int(idle.Milliseconds()), cbuf(buf), errLen) != 0 {
		return errors.New(goString(buf))
	}
	return nil
}

// shutdown ends both directions of the socket f refers to, for every descriptor of it:
// the worker's next read of the runner sees the end.
func shutdown(f *os.File) {
	raw, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(s uintptr) { _ = syscall.Shutdown(int(s), syscall.SHUT_RDWR) })
}

// take closes conn and returns its file, for the caller to close, and a duplicate of
// its descriptor for the C side (dupFD).
func take(conn *net.TCPConn) (*os.File, int, error) {
	f, err := conn.File()
	conn.Close()
	if err != nil {
		return nil, -1, err
	}
	fd, err := dupFD(f)
	if err != nil {
		f.Close()
		return nil, -1, err
	}
	return f, fd, nil
}

func dupFD(f *os.File) (int, error) {
	raw, err := f.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := raw.Control(func(s uintptr) { fd, derr = dup(int(s)) }); err != nil {
		return -1, err
	}
	return fd, derr
}

func cbuf(b []byte) *C.char { return (*C.char)(unsafe.Pointer(&b[0])) }

func goString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
