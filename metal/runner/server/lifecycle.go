//go:build cgo && !race

package server

import (
	"context"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// runState is the runner's lifecycle as /health reports it: loading (with its
// progress), ready with its engines, failed (the load, or a split worker's link) or
// stopping; the stop requests (/shutdown, the parent's exit, the orphan timeout) and
// the requests in flight that the orphan timeout watches. Every endpoint that needs
// the loaded model passes its gate (engine).
type runState struct {
	log   logr.Logger
	nonce string // echoed on /health

	mu       sync.Mutex
	state    string
	progress float64
	loadErr  string
	lostErr  string     // a split worker's failed link, once the runner has failed for it
	eng      *engineSet // set with the ready state

	failureSeen     chan struct{} // closed once /health has reported a failure
	failureSeenOnce sync.Once
	lost            chan struct{} // closed once a split worker is lost
	stopReq         chan struct{}
	stopOnce        sync.Once
	cancelLoad      atomic.Bool

	// lastRequest (unix nanoseconds) and inFlight drive the orphan timeout.
	lastRequest atomic.Int64
	inFlight    atomic.Int64
}

func newRunState(log logr.Logger, nonce string) *runState {
	rs := &runState{log: log, nonce: nonce, state: runnerapi.StateLoading,
		failureSeen: make(chan struct{}), lost: make(chan struct{}), stopReq: make(chan struct{})}
	rs.lastRequest.Store(time.Now().UnixNano())
	return rs
}

func (rs *runState) set(state, errMsg string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.state == runnerapi.StateStopping && state != runnerapi.StateStopping {
		return
	}
	rs.state = state
	if errMsg != "" {
		rs.loadErr = errMsg
	}
	if state == runnerapi.StateReady {
		rs.progress = 1
	}
}

func (rs *runState) get() (string, float64, string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.state, rs.progress, rs.loadErr
}

// loadProgress records how far the weights have loaded (p of 1) and reports whether
// the load goes on: false once the runner is stopping.
func (rs *runState) loadProgress(p float32) bool {
	rs.mu.Lock()
	// The context is created after the weights: keep 5% for it.
	rs.progress = 0.95 * float64(p)
	rs.mu.Unlock()
	return !rs.cancelLoad.Load()
}

// stopLoading moves to stopping and cancels a load in progress.
func (rs *runState) stopLoading() {
	rs.set(runnerapi.StateStopping, "")
	rs.cancelLoad.Store(true)
}

// ready hands the loaded engines to the requests: the state becomes ready.
func (rs *runState) ready(eng *engineSet) {
	rs.mu.Lock()
	rs.eng = eng
	rs.mu.Unlock()
	rs.set(runnerapi.StateReady, "")
}

// engine returns the engines when the runner serves requests, else the error to
// answer.
func (rs *runState) engine() (*engineSet, *runnerapi.Error) {
	rs.mu.Lock()
	state, progress, loadErr, lost, eng := rs.state, rs.progress, rs.loadErr, rs.lostErr, rs.eng
	rs.mu.Unlock()
	switch state {
	case runnerapi.StateReady:
		return eng, nil
	case runnerapi.StateLoading:
		return nil, runnerapi.Unavailable(runnerapi.CodeLoading, "the model is loading (%.0f%%)", 100*progress)
	case runnerapi.StateFailed:
		if lost != "" {
			return nil, runnerapi.Unavailable(runnerapi.CodeSplitWorkerLost, "%s", lost)
		}
		return nil, runnerapi.Unavailable(runnerapi.CodeLoadFailed, "the model failed to load: %s", loadErr)
	default:
		return nil, runnerapi.Unavailable(runnerapi.CodeShuttingDown, "the runner is stopping")
	}
}

// lose fails the runner once a split worker is lost: /health reports it, new
// requests are refused, and the runner exits (SplitLostError) so that the agent takes
// the replica out of service as for any runner that died.
func (rs *runState) lose(err error) *runnerapi.Error {
	rs.mu.Lock()
	first := rs.lostErr == ""
	if first {
		rs.lostErr = err.Error()
	}
	rs.mu.Unlock()
	if first {
		rs.log.Error(err, "A split worker is lost; the runner serves nothing more")
		rs.set(runnerapi.StateFailed, err.Error())
		close(rs.lost)
	}
	return runnerapi.Unavailable(runnerapi.CodeSplitWorkerLost, "%v", err)
}

// lostMessage is the failed link the runner stopped serving for, empty if none.
func (rs *runState) lostMessage() string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.lostErr
}

// requestStop asks Run to stop gracefully.
func (rs *runState) requestStop() { rs.stopOnce.Do(func() { close(rs.stopReq) }) }

// awaitFailureSeen lets the agent read a failure on /health, bounded: the exit code
// and stderr tell it too.
func (rs *runState) awaitFailureSeen(ctx context.Context) {
	select {
	case <-rs.failureSeen:
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
	case <-rs.stopReq:
	}
}

func (rs *runState) handleHealth(w http.ResponseWriter, _ *http.Request) {
	state, progress, loadErr := rs.get()
	h := runnerapi.Health{Status: state, Progress: progress, Nonce: rs.nonce}
	status := http.StatusServiceUnavailable
	switch state {
	case runnerapi.StateReady:
		status = http.StatusOK
	case runnerapi.StateFailed:
		h.Error = loadErr
		defer rs.failureSeenOnce.Do(func() { close(rs.failureSeen) })
	}
	writeJSON(w, status, h)
}

func (rs *runState) handleShutdown(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusAccepted, map[string]string{"status": runnerapi.StateStopping})
	rs.requestStop()
}

// watchParent requests a stop once the process is re-parented (its parent exited).
func (rs *runState) watchParent(ctx context.Context, ppid int) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-rs.stopReq:
			return
		case <-t.C:
			if os.Getppid() != ppid {
				rs.log.Info("Parent process exited; stopping", "parentPID", ppid)
				rs.requestStop()
				return
			}
		}
	}
}

// watchOrphaned requests a stop once no request has arrived for timeout and none is
// in flight.
func (rs *runState) watchOrphaned(ctx context.Context, timeout time.Duration) {
	t := time.NewTicker(min(time.Second, max(timeout/4, 10*time.Millisecond)))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-rs.stopReq:
			return
		case <-t.C:
			idle := time.Since(time.Unix(0, rs.lastRequest.Load()))
			if rs.inFlight.Load() == 0 && idle >= timeout {
				rs.log.Info("No request within the orphan timeout; stopping", "timeout", timeout)
				rs.requestStop()
				return
			}
		}
	}
}

// tracked counts requests for the orphan timeout: one in flight is activity, and its
// end restarts the idle clock.
func (rs *runState) tracked(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rs.inFlight.Add(1)
		rs.lastRequest.Store(time.Now().UnixNano())
		defer func() {
			rs.lastRequest.Store(time.Now().UnixNano())
			rs.inFlight.Add(-1)
		}()
		next.ServeHTTP(w, r)
	})
}
