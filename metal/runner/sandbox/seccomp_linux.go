package sandbox

import (
	"fmt"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Landlock's network rules do not cover every socket a runner could use: UDP before
// Landlock ABI 10, pathname unix sockets before ABI 9, raw and netlink sockets, and
// on current kernels Multipath TCP, which connects and listens past the TCP rules
// (and falls back to plain TCP with a peer that does not speak it). A seccomp filter
// closes them: a runner may create stream sockets of the unix family only (a loopback
// runner also TCP ones, to listen), may not connect(2) at all, and may not set up
// io_uring, whose socket operations a filter on system calls does not see.
//
// A GPU runner (Policy.BackendDir, once the launcher found a backend there) may also
// create unix sockets of the seqpacket type: the CUDA driver fails to start without
// one ("OS call failed or operation not supported on this OS"). It makes one to
// reach the MPS control daemon, whose connect(2) is refused like any other (the
// driver then runs without MPS), and one it listens on, at an abstract address, to
// hand its unified-memory descriptor to peers. A seqpacket socket sends nothing
// before it is connected or has accepted, so this opens no way out; unix datagram
// sockets, which send to any address without a connect, stay refused.

// auditArch is the seccomp architecture of each GOARCH the filter knows.
var auditArch = map[string]uint32{"amd64": unix.AUDIT_ARCH_X86_64, "arm64": unix.AUDIT_ARCH_AARCH64}

// x32SyscallBit marks the x32 ABI's system calls on amd64: refused, so that no
// socket(2) reaches the kernel under another number.
const x32SyscallBit = 0x40000000

// socketFilter is the seccomp program of a runner. seccomp_data: nr at 0, arch at 4,
// args[0] (its low half, little-endian) at 16.
// A split head runner (Policy.ConnectPorts) may make TCP sockets and connect(2):
// which ports it may reach, Landlock says. p.BackendDir is set for a GPU runner
// only.
func socketFilter(goarch string, p Policy) ([]bpf.Instruction, error) {
	loopback, connect := p.Loopback, len(p.ConnectPorts) > 0
	arch, ok := auditArch[goarch]
	if !ok {
		return nil, fmt.Errorf("no seccomp filter for %s", goarch)
	}
	ret := func(errno syscall.Errno) bpf.Instruction {
		return bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(errno)}
	}
	allow := bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW}
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: arch, SkipTrue: 1},
		ret(unix.ENOSYS),
		bpf.LoadAbsolute{Off: 0, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: x32SyscallBit, SkipFalse: 1},
		ret(unix.ENOSYS),
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(unix.SYS_IO_URING_SETUP), SkipFalse: 1},
		ret(unix.EPERM),
	}
	if !connect {
		// A runner accepts; it never connects, not even to a unix socket (another
		// runner's, before Landlock ABI 9 covers them), tracing or not: its spans
		// leave through its agent (package internal/tracing/spanrelay).
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(unix.SYS_CONNECT), SkipFalse: 1},
			ret(unix.EACCES))
	}
	prog = append(prog,
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(unix.SYS_SOCKET), SkipTrue: 1},
		allow,
		bpf.LoadAbsolute{Off: 24, Size: 4}, // the type
		bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xf}, // without SOCK_NONBLOCK, SOCK_CLOEXEC
	)
	if p.BackendDir != "" {
		// A seqpacket socket of the unix family; a stream socket goes on to the
		// family checks below.
		prog = append(prog,
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SOCK_STREAM, SkipTrue: 5},
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SOCK_SEQPACKET, SkipFalse: 3},
			bpf.LoadAbsolute{Off: 16, Size: 4}, // the family
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_UNIX, SkipFalse: 1},
			allow)
	} else {
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SOCK_STREAM, SkipTrue: 1})
	}
	prog = append(prog,
		ret(unix.EACCES),
		bpf.LoadAbsolute{Off: 16, Size: 4}, // the family
	)
	if !loopback && !connect {
		return append(prog,
			bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_UNIX, SkipTrue: 1},
			ret(unix.EACCES),
			allow), nil
	}
	// A loopback runner may also make TCP sockets to listen on, but not Multipath TCP (which Landlock's TCP rules do
	// not see): EPROTONOSUPPORT makes Go fall back to plain TCP.
	return append(prog,
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_UNIX, SkipTrue: 6}, // allow
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_INET, SkipTrue: 1},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AF_INET6, SkipFalse: 3},      // refuse
		bpf.LoadAbsolute{Off: 32, Size: 4},                                     // the protocol
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.IPPROTO_MPTCP, SkipFalse: 2}, // allow
		ret(unix.EPROTONOSUPPORT),
		ret(unix.EACCES),
		allow), nil
}

// installSocketFilter applies socketFilter to every thread of this process (the
// launcher, about to execute the runner).
func installSocketFilter(p Policy) error {
	prog, err := socketFilter(runtime.GOARCH, p)
	if err != nil {
		return err
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return err
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, in := range raw {
		filter[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	// SPEC_ALLOW: a filter does not turn on the Speculative Store Bypass mitigation,
	// which would slow the runner's arithmetic and guards nothing here (code that
	// runs in the runner reads its memory without speculating). Kernels before 4.17
	// do not know the flag.
	install := func(flags uintptr) syscall.Errno {
		_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
		return errno
	}
	errno := install(unix.SECCOMP_FILTER_FLAG_TSYNC | unix.SECCOMP_FILTER_FLAG_SPEC_ALLOW)
	if errno == unix.EINVAL {
		errno = install(unix.SECCOMP_FILTER_FLAG_TSYNC)
	}
	if errno != 0 {
		return fmt.Errorf("installing the seccomp filter: %w", errno)
	}
	return nil
}
