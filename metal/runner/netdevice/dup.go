//go:build cgo && !race

package netdevice

import "syscall"

// dup duplicates a descriptor for the C side, which closes its copy itself; the copy
// is blocking (timeouts come from SO_RCVTIMEO and SO_SNDTIMEO).
func dup(fd int) (int, error) {
	nfd, err := syscall.Dup(fd)
	if err != nil {
		return -1, err
	}
	syscall.CloseOnExec(nfd)
	// The descriptor shares its file status flags with the Go connection's, which is
	// non-blocking.
	if err := syscall.SetNonblock(nfd, false); err != nil {
		syscall.Close(nfd)
		return -1, err
	}
	return nfd, nil
}
