package sandbox

import (
	"encoding/binary"
	"fmt"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// TestSocketFilter runs the seccomp program on the system calls of each kind of
// runner: which sockets it may create and whether it may connect.
func TestSocketFilter(t *testing.T) {
	const (
		allowed = "allow"
		denied  = "EACCES"
	)
	call := func(nr uintptr, args ...uint32) []byte {
		// seccomp_data: nr, arch, instruction pointer, six arguments, of which the
		// filter reads the low half (at the lower address, little-endian). The VM
		// loads words big-endian where the kernel loads them in the machine's
		// order: each word is written as the VM reads it.
		b := make([]byte, 64)
		binary.BigEndian.PutUint32(b[0:], uint32(nr))
		binary.BigEndian.PutUint32(b[4:], auditArch["amd64"])
		for i, a := range args {
			binary.BigEndian.PutUint32(b[16+8*i:], a)
		}
		return b
	}
	socket := func(family, typ int) []byte { return call(unix.SYS_SOCKET, uint32(family), uint32(typ), 0) }
	cpu := Policy{}
	gpu := Policy{BackendDir: "/opt/mf/lib"}
	loopbackGPU := Policy{BackendDir: "/opt/mf/lib", Loopback: true}
	for _, tc := range []struct {
		name string
		p    Policy
		data []byte
		want string
	}{
		{"cpu: unix stream", cpu, socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC), allowed},
		{"cpu: unix seqpacket", cpu, socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC), denied},
		{"cpu: unix datagram", cpu, socket(unix.AF_UNIX, unix.SOCK_DGRAM), denied},
		{"cpu: tcp", cpu, socket(unix.AF_INET, unix.SOCK_STREAM), denied},
		{"cpu: connect", cpu, call(unix.SYS_CONNECT, 3), denied},
		// The CUDA driver's sockets: one to the MPS daemon, one it listens on.
		{"gpu: unix seqpacket", gpu, socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC), allowed},
		{"gpu: unix stream", gpu, socket(unix.AF_UNIX, unix.SOCK_STREAM), allowed},
		{"gpu: connect", gpu, call(unix.SYS_CONNECT, 3), denied},
		{"gpu: unix datagram", gpu, socket(unix.AF_UNIX, unix.SOCK_DGRAM), denied},
		{"gpu: inet seqpacket", gpu, socket(unix.AF_INET, unix.SOCK_SEQPACKET), denied},
		{"gpu: inet6 seqpacket", gpu, socket(unix.AF_INET6, unix.SOCK_SEQPACKET), denied},
		{"gpu: tcp", gpu, socket(unix.AF_INET, unix.SOCK_STREAM), denied},
		{"gpu: netlink", gpu, socket(unix.AF_NETLINK, unix.SOCK_RAW), denied},
		{"gpu: io_uring", gpu, call(unix.SYS_IO_URING_SETUP), "EPERM"},
		{"loopback gpu: tcp", loopbackGPU, socket(unix.AF_INET, unix.SOCK_STREAM), allowed},
		{"loopback gpu: multipath tcp", loopbackGPU, call(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_MPTCP), "EPROTONOSUPPORT"},
		{"loopback gpu: unix seqpacket", loopbackGPU, socket(unix.AF_UNIX, unix.SOCK_SEQPACKET), allowed},
		{"loopback gpu: inet seqpacket", loopbackGPU, socket(unix.AF_INET, unix.SOCK_SEQPACKET), denied},
		{"loopback gpu: udp", loopbackGPU, socket(unix.AF_INET, unix.SOCK_DGRAM), denied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog, err := socketFilter("amd64", tc.p)
			if err != nil {
				t.Fatal(err)
			}
			vm, err := bpf.NewVM(prog)
			if err != nil {
				t.Fatal(err)
			}
			ret, err := vm.Run(tc.data)
			if err != nil {
				t.Fatal(err)
			}
			got := fmt.Sprintf("%#x", ret)
			switch uint32(ret) {
			case unix.SECCOMP_RET_ALLOW:
				got = allowed
			case unix.SECCOMP_RET_ERRNO | uint32(unix.EACCES):
				got = denied
			case unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM):
				got = "EPERM"
			case unix.SECCOMP_RET_ERRNO | uint32(unix.EPROTONOSUPPORT):
				got = "EPROTONOSUPPORT"
			}
			if got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}
