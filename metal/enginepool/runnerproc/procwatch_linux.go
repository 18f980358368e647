package runnerproc

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/macfleet/macfleet/metal/enginepool"
)

// pidfdHandle watches and signals a process through a pidfd: the descriptor names one
// process, so neither the wait nor a signal can ever reach a later process that got
// the same pid.
type pidfdHandle struct {
	pidfd int
	// The read end of a pipe whose write end close() closes: it ends a wait.
	cancelR, cancelW int

	mu       sync.Mutex
	done     bool // wait returned: the descriptors are closed
	canceled bool
}

func openProc(pid int) (procHandle, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("pid %d: %w", pid, enginepool.ErrProcessNotFound)
		}
		return nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("pipe: %w", err)
	}
	return &pidfdHandle{pidfd: fd, cancelR: p[0], cancelW: p[1]}, nil
}

func (h *pidfdHandle) wait() bool {
	fds := []unix.PollFd{{Fd: int32(h.pidfd), Events: unix.POLLIN}, {Fd: int32(h.cancelR), Events: unix.POLLIN}}
	exited := false
	for {
		_, err := unix.Poll(fds, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			// Not expected with valid descriptors; treat the process as gone rather
			// than spin.
			exited = true
			break
		}
		if fds[0].Revents != 0 {
			exited = true
			break
		}
		if fds[1].Revents != 0 {
			break
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.done = true
	unix.Close(h.pidfd)
	unix.Close(h.cancelR)
	if !h.canceled {
		unix.Close(h.cancelW)
	}
	return exited
}

func (h *pidfdHandle) signal(sig syscall.Signal) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		return os.ErrProcessDone
	}
	return unix.PidfdSendSignal(h.pidfd, sig, nil, 0)
}

func (h *pidfdHandle) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done || h.canceled {
		return
	}
	h.canceled = true
	unix.Close(h.cancelW) // the wait sees POLLHUP on the read end
}

// procStartTime is field 22 of /proc/PID/stat: when the process started, in clock
// ticks since boot. With the pid it names one process of this boot.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("pid %d: %w", pid, enginepool.ErrProcessNotFound)
		}
		return 0, err
	}
	return parseStatStartTime(string(b))
}

// parseStatStartTime reads the start time from a /proc/PID/stat line. The command
// name (field 2) is in parentheses and may hold spaces or parentheses itself, so the
// fields are counted from the last ')'.
func parseStatStartTime(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("%w: stat %q", enginepool.ErrMalformed, stat)
	}
	fields := strings.Fields(stat[i+1:])
	const startTime = 22 - 3 // fields after ')' start with field 3 (state)
	if len(fields) <= startTime {
		return 0, fmt.Errorf("%w: stat has %d fields", enginepool.ErrMalformed, len(fields)+2)
	}
	v, err := strconv.ParseUint(fields[startTime], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: stat start time %q", enginepool.ErrMalformed, fields[startTime])
	}
	return v, nil
}
