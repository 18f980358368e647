package testenv

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Port is a loopback TCP port held for a test's lifetime by a socket bound to it but
// not listening. Connections to Addr are refused until Listen, and no other process
// can take the port meanwhile, as it could once a listener on port 0 was closed.
type Port struct {
	Addr string
}

// ReservePort holds a free loopback port until the test ends.
func ReservePort(tb testing.TB) *Port {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = syscall.Close(fd) })
	// SO_REUSEPORT lets Listen's sockets (which set it too) share the port; sockets
	// without it, as other programs' are, cannot bind it.
	if err := syscall.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		tb.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatal(err)
	}
	return &Port{Addr: fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)}
}

// Listen listens on the port; once that listener is closed the port refuses
// connections again, and Listen may be called again.
func (p *Port) Listen() (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", p.Addr)
}
