package runnerproc

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/macfleet/macfleet/metal/enginepool"
)

// kqueueHandle watches a process with a kqueue EVFILT_PROC/NOTE_EXIT filter, which
// fires for that process only (a later process with the same pid is not watched).
// darwin has no pidfd: a signal goes to the pid, and only while the exit has not been
// seen (the window for pid reuse is one exit-and-fork between two kevent polls).
type kqueueHandle struct {
	pid int
	kq  int

	mu       sync.Mutex
	done     bool
	canceled bool
}

func openProc(pid int) (procHandle, error) {
	kq, err := unix.Kqueue()
	if err != nil {
		return nil, fmt.Errorf("kqueue: %w", err)
	}
	unix.CloseOnExec(kq)
	var ev unix.Kevent_t
	unix.SetKevent(&ev, pid, unix.EVFILT_PROC, unix.EV_ADD|unix.EV_ONESHOT)
	ev.Fflags = unix.NOTE_EXIT
	if _, err := unix.Kevent(kq, []unix.Kevent_t{ev}, nil, nil); err != nil {
		unix.Close(kq)
		if errors.Is(err, unix.ESRCH) {
			return nil, fmt.Errorf("pid %d: %w", pid, enginepool.ErrProcessNotFound)
		}
		return nil, fmt.Errorf("kevent %d: %w", pid, err)
	}
	return &kqueueHandle{pid: pid, kq: kq}, nil
}

func (h *kqueueHandle) wait() bool {
	events := make([]unix.Kevent_t, 1)
	exited := false
	for {
		ts := unix.NsecToTimespec(int64(200 * time.Millisecond))
		n, err := unix.Kevent(h.kq, nil, events, &ts)
		if err != nil && !errors.Is(err, unix.EINTR) {
			exited = true
			break
		}
		if n > 0 {
			exited = true
			break
		}
		h.mu.Lock()
		canceled := h.canceled
		h.mu.Unlock()
		if canceled {
			break
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.done = true
	unix.Close(h.kq)
	return exited
}

func (h *kqueueHandle) signal(sig syscall.Signal) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		return os.ErrProcessDone
	}
	return unix.Kill(h.pid, sig)
}

func (h *kqueueHandle) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.canceled = true
}

// procStartTime is the process's start time (kern.proc.pid p_starttime) in
// microseconds since the epoch.
func procStartTime(pid int) (uint64, error) {
	kp, err := unix.SysctlKinfoProc("kern.proc.pid", pid)
	if err != nil {
		return 0, fmt.Errorf("kern.proc.pid %d: %w", pid, err)
	}
	if int(kp.Proc.P_pid) != pid {
		return 0, fmt.Errorf("pid %d: %w", pid, enginepool.ErrProcessNotFound)
	}
	tv := kp.Proc.P_starttime
	return uint64(tv.Sec)*1e6 + uint64(tv.Usec), nil
}
