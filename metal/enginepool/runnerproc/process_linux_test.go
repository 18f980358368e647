package runnerproc

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// procTestDiesWithAgent checks the parent-death signal: this test binary, re-run as a
// stand-in agent (TestProcessRunnerHelperAgent), starts one runner and is SIGKILLed;
// the runner must die with it. The test process makes itself a child subreaper so the
// orphan is handed to it and can be reaped and inspected here.
func procTestDiesWithAgent(t *testing.T, bin, model string) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatalf("becoming a subreaper: %v", err)
	}
	agent := exec.Command(os.Args[0], "-test.run=^TestProcessRunnerHelperAgent$")
	agent.Env = append(os.Environ(), procHelperRunnerEnv+"="+bin, procHelperModelEnv+"="+model)
	out, err := agent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Process.Kill(); _ = agent.Wait() })
	type started struct {
		pid int
		dir string
	}
	runners := make(chan started, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var s started
			if _, err := fmt.Sscanf(sc.Text(), "runner-pid %d %s", &s.pid, &s.dir); err == nil {
				runners <- s
			}
		}
	}()
	var runner started
	select {
	case runner = <-runners:
	case <-time.After(30 * time.Second):
		t.Fatal("the stand-in agent did not start its runner")
	}
	// Nobody is left to remove the dead agent's socket directory.
	t.Cleanup(func() { os.RemoveAll(runner.dir) })

	if err := agent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = agent.Wait()

	// The orphan is now our child, or becomes it as the agent's last thread exits: reap
	// it and see what killed it.
	ws, err := reapOrphan(runner.pid, 10*time.Second)
	if err != nil {
		_ = syscall.Kill(runner.pid, syscall.SIGKILL) // do not leave it running
		t.Fatal(err)
	}
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("orphaned runner ended with %v, want SIGKILL from the parent-death signal", ws)
	}
}

// reapOrphan waits up to timeout for pid, an orphan handed to this subreaper, to end,
// and reaps it. Until it is handed over, wait4 answers ECHILD while the process is
// still there (its parent's threads are exiting); gone and never ours, another
// process reaped it: it died before its agent.
func reapOrphan(pid int, timeout time.Duration) (unix.WaitStatus, error) {
	var ws unix.WaitStatus
	deadline := time.Now().Add(timeout)
	for tick := time.NewTicker(5 * time.Millisecond); ; <-tick.C {
		got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
		switch {
		case got == pid:
			tick.Stop()
			return ws, nil
		case errors.Is(err, unix.ECHILD):
			stat, serr := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if serr != nil {
				return ws, fmt.Errorf("the runner %d is gone but was never this process's to reap: it ended before its agent", pid)
			}
			if time.Now().After(deadline) {
				return ws, fmt.Errorf("the runner %d was not handed to this subreaper in %v: %s", pid, timeout, stat)
			}
		case err != nil:
			return ws, fmt.Errorf("reaping the orphaned runner %d: %w", pid, err)
		case time.Now().After(deadline):
			return ws, fmt.Errorf("the orphaned runner %d outlived its agent by %v", pid, timeout)
		}
	}
}
