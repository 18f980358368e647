package runnerproc

import (
	"bufio"
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

	// The orphan is now our child: reap it and see what killed it.
	reaped := make(chan error, 1)
	var ws unix.WaitStatus
	go func() {
		_, err := unix.Wait4(runner.pid, &ws, 0, nil)
		reaped <- err
	}()
	select {
	case err := <-reaped:
		if err != nil {
			t.Fatalf("reaping the orphaned runner %d: %v", runner.pid, err)
		}
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(runner.pid, syscall.SIGKILL) // do not leave it running
		t.Fatalf("the orphaned runner %d outlived its agent by 10s", runner.pid)
	}
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("orphaned runner ended with %v, want SIGKILL from the parent-death signal", ws)
	}
}
