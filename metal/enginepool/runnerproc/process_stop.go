package runnerproc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"syscall"
	"time"
)

// StopStep is how far Stop had to escalate before the runner exited.
type StopStep string

const (
	// StopShutdown: the runner exited after POST /shutdown.
	StopShutdown StopStep = "shutdown"
	// StopTerm: it needed SIGTERM.
	StopTerm StopStep = "sigterm"
	// StopKill: it needed SIGKILL.
	StopKill StopStep = "sigkill"
)

// Stop stops the runner and returns once it has been reaped: POST /shutdown and wait
// up to grace; SIGTERM the process group and wait KillAfter; SIGKILL the group. A
// grace of zero or less kills at once. Stop is idempotent and safe to call
// concurrently: the first call's grace drives the escalation, every call returns when
// the process is gone, and a call whose ctx ends kills the runner at once. It returns
// an error only if the process could not be reaped after SIGKILL.
func (r *ProcessRunner) Stop(ctx context.Context, grace time.Duration) error {
	r.mu.Lock()
	if r.handedOff {
		r.mu.Unlock()
		return fmt.Errorf("runner of %q (pid %d) was detached: it is not this agent's to stop", r.model, r.pid)
	}
	r.stopRequested = true
	r.mu.Unlock()
	r.stopOnce.Do(func() { go r.stopSequence(grace) })
	select {
	case <-r.exited:
		return nil
	case <-ctx.Done():
	}
	r.log.Info("Stop interrupted: killing the runner", "reason", context.Cause(ctx))
	r.noteStep(StopKill)
	r.signal(syscall.SIGKILL)
	select {
	case <-r.exited:
		return nil
	case <-time.After(reapWait):
		return fmt.Errorf("runner of %q (pid %d) not reaped %s after SIGKILL", r.model, r.pid, reapWait)
	}
}

// stopSequence escalates from a graceful shutdown to SIGKILL. It runs once.
func (r *ProcessRunner) stopSequence(grace time.Duration) {
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-r.exited:
			return true
		case <-t.C:
			return false
		}
	}
	if grace > 0 {
		// A split worker has no HTTP API: SIGTERM is its graceful stop (it ends the
		// session it serves and exits).
		if !r.worker && r.shutdown(grace, wait) {
			return
		}
		r.noteStep(StopTerm)
		r.signal(syscall.SIGTERM)
		if wait(r.killAfter) {
			return
		}
	}
	r.noteStep(StopKill)
	r.signal(syscall.SIGKILL)
	if !wait(reapWait) {
		r.log.Info("Runner not reaped after SIGKILL", "wait", reapWait)
	}
}

// shutdown asks the runner over HTTP to stop and waits up to grace; it reports whether
// the runner exited.
func (r *ProcessRunner) shutdown(grace time.Duration, wait func(time.Duration) bool) bool {
	r.lastSpans()
	r.noteStep(StopShutdown)
	deadline := time.Now().Add(grace)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	err := r.call(ctx, http.MethodPost, "/shutdown", struct{}{}, nil)
	cancel()
	if err != nil && !errors.Is(err, ErrRunnerExited) {
		// A runner already stopping may drop the answer; one that is wedged
		// gets SIGTERM once the grace is over either way.
		r.log.V(1).Info("Shutdown request failed", "err", err.Error())
	}
	return wait(time.Until(deadline))
}

// noteStep records the furthest escalation reached, unless the process is already gone.
func (r *ProcessRunner) noteStep(s StopStep) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.reaped {
		return
	}
	if stepRank(s) > stepRank(r.stoppedBy) {
		r.stoppedBy = s
	}
}

func stepRank(s StopStep) int {
	switch s {
	case StopShutdown:
		return 1
	case StopTerm:
		return 2
	case StopKill:
		return 3
	}
	return 0
}
