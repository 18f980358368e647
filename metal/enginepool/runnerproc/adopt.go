package runnerproc

// Runner adoption across agent restarts (ProcessConfig.StateDir): detached runners are
// recorded in the state directory, a restarted agent adopts the ones whose engine is
// unchanged, and stops the rest once it knows what it wants (StopUnclaimed).
//
// A record is trusted only as far as the process proves it: a runner is adopted when
// its pid is alive with the recorded process start time and it answers on the
// recorded address with the recorded nonce and pid. A process is signalled only when
// its pid and start time match the record (and, on Linux, only through a pidfd opened
// before the check), so a recycled pid is never killed.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/metal/enginepool"
)

// procHandle watches and signals one process: it never signals a later process that
// got the same pid. Implementations: procwatch_linux.go (pidfd), procwatch_darwin.go
// (kqueue).
type procHandle interface {
	// wait blocks until the process has exited (true) or close was called (false).
	// It is called once; it releases the handle's resources when it returns.
	wait() bool
	// signal sends sig unless the process is known to have exited.
	signal(sig syscall.Signal) error
	// close ends wait without the process having exited.
	close()
}

var _ enginepool.Detacher = (*ProcessRunner)(nil)

// runnerRecord is one detached runner, stored as StateDir/<id>.json; its output is
// StateDir/<id>.log.
type runnerRecord struct {
	ID    string `json:"id"`
	Model string `json:"model"`
	PID   int    `json:"pid"`
	// StartTime is the process's start time (clock ticks since boot on Linux,
	// microseconds since the epoch on darwin); zero when it could not be read.
	StartTime uint64 `json:"startTime,omitempty"`
	// Network ("unix" or "tcp") and Address are where the runner listens.
	Network string `json:"network"`
	Address string `json:"address"`
	// Dir is the runner's private socket directory.
	Dir string `json:"dir"`
	// Fingerprint covers everything the engine depends on (runner binary, model
	// file, flags, the restart-relevant ModelSpec fields, the ceiling).
	Fingerprint  string `json:"fingerprint"`
	CeilingBytes int64  `json:"ceilingBytes"`
	// CacheDir is the prompt cache directory the runner was started with ("" for
	// none). It is not in the fingerprint: a runner may have got another of the
	// file's directories (<id>~2, ...: see claimCacheDir), and an adopted runner
	// keeps the one it has.
	CacheDir string    `json:"cacheDir,omitempty"`
	Nonce    string    `json:"nonce"`
	Created  time.Time `json:"created"`
}

// Timeouts of adoption.
const (
	// adoptCheckTimeout bounds the health and status calls proving a recorded runner.
	adoptCheckTimeout = 2 * time.Second
	// unclaimedGrace is the graceful part of stopping an unclaimed runner.
	unclaimedGrace = 5 * time.Second
)

// Adopted says whether the runner was adopted from an earlier agent rather than
// started by this one.
func (r *ProcessRunner) Adopted() bool { return r.handle != nil }

// Detach lets go of a runner started with a StateDir without stopping it: its record
// stays for the next agent, it is never signalled by this one again, and Exited
// closes only if the process happens to exit later. It reports false for a runner
// that is not detached or is stopping or gone. In-flight requests keep their
// connections.
func (r *ProcessRunner) Detach() bool {
	if r.rec == nil {
		return false
	}
	r.mu.Lock()
	if r.handedOff {
		r.mu.Unlock()
		return true
	}
	if r.reaped || r.stopRequested {
		r.mu.Unlock()
		return false
	}
	r.handedOff = true
	cacheDir := r.cacheDir
	r.cacheDir = ""
	r.mu.Unlock()
	r.factory.releaseCacheDir(cacheDir)
	close(r.detached)
	if r.handle != nil {
		r.handle.close()
	}
	r.factory.unclaim(r.rec.ID)
	r.transport.CloseIdleConnections()
	r.log.V(1).Info("Runner detached: left running for the next agent")
	return true
}

// StopUnclaimed stops every recorded runner that this factory has neither started nor
// adopted: the agent calls it once its first sync has claimed what it wants, so a
// runner of a model that changed or went away never outlives the restart. Records of
// dead runners, and of pids that now belong to another process, are removed without
// signalling anything. It returns how many runner processes it stopped.
func (f *ProcessFactory) StopUnclaimed(ctx context.Context) (int, error) {
	if f.cfg.StateDir == "" {
		return 0, nil
	}
	log := f.cfg.Log
	if log.GetSink() == nil {
		log = logr.FromContextOrDiscard(ctx)
	}
	recs, err := f.readRecords()
	if err != nil {
		return 0, err
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		stopped int
		errs    []error
	)
	for _, rec := range recs {
		if !f.claim(rec.ID) {
			continue
		}
		wg.Go(func() {
			ok, err := f.stopRecorded(ctx, rec, log)
			mu.Lock()
			defer mu.Unlock()
			if ok {
				stopped++
			}
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	return stopped, errors.Join(errs...)
}

// RecordedModels lists the models (ModelSpec.Name) of the runners recorded in the
// StateDir that this factory has not claimed: what an earlier agent left running. A
// restarted agent loads those of them it still wants (adoption takes milliseconds; an
// OnDemand model is otherwise only loaded on its first request) before it calls
// StopUnclaimed.
func (f *ProcessFactory) RecordedModels() ([]string, error) {
	if f.cfg.StateDir == "" {
		return nil, nil
	}
	recs, err := f.readRecords()
	if err != nil {
		return nil, err
	}
	f.claimMu.Lock()
	defer f.claimMu.Unlock()
	var names []string
	for _, rec := range recs {
		if !f.claimed[rec.ID] {
			names = append(names, rec.Model)
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// stopRecorded stops the runner of one claimed record if it is still the recorded
// process, and removes the record either way.
func (f *ProcessFactory) stopRecorded(ctx context.Context, rec *runnerRecord, log logr.Logger) (bool, error) {
	r, err := f.attach(rec, log)
	if err != nil {
		f.unclaim(rec.ID)
		if errors.Is(err, errStaleRecord) {
			log.V(1).Info("Removed the record of a runner that is gone", "recordPID", rec.PID, "reason", err.Error())
			return false, nil
		}
		return false, fmt.Errorf("stopping the unclaimed runner of %q (pid %d): %w", rec.Model, rec.PID, err)
	}
	if rec.StartTime == 0 {
		// Without a start time only the runner itself can prove who it is.
		if _, err := r.verify(ctx, rec); err != nil {
			r.release()
			f.dropRecord(rec)
			f.unclaim(rec.ID)
			log.Info("Not stopping an unproven recorded runner; record removed", "recordPID", rec.PID, "reason", err.Error())
			return false, nil
		}
	}
	go r.reap()
	go r.followLog(f.logPath(rec.ID), true, nil)
	log.Info("Stopping a runner no model claimed", "model", rec.Model, "pid", rec.PID)
	if err := r.Stop(ctx, unclaimedGrace); err != nil {
		return false, err
	}
	return true, nil
}

// adopt returns a recorded runner with fingerprint fp that is alive and proves its
// identity, claimed for this factory; nil when there is none.
func (f *ProcessFactory) adopt(ctx context.Context, spec enginepool.ModelSpec, fp string, log logr.Logger) *ProcessRunner {
	recs, err := f.readRecords()
	if err != nil {
		log.Info("Reading the runner records failed; starting a new runner", "err", err.Error())
		return nil
	}
	for _, rec := range recs {
		if rec.Fingerprint != fp || !f.claim(rec.ID) {
			continue
		}
		r, err := f.adoptRecord(ctx, rec, log)
		if err == nil {
			r.log.Info("Adopted a running runner", "address", r.dialAddress, "since", rec.Created)
			return r
		}
		log.Info("Not adopting a recorded runner", "model", spec.Name, "recordPID", rec.PID, "reason", err.Error())
		f.unclaim(rec.ID)
	}
	return nil
}

// adoptRecord attaches to the record's process and checks that it is a healthy runner
// with the recorded nonce. A recorded process that fails the check is stopped (its
// start time proved it ours) unless it answered with another nonce.
func (f *ProcessFactory) adoptRecord(ctx context.Context, rec *runnerRecord, log logr.Logger) (*ProcessRunner, error) {
	r, err := f.attach(rec, log)
	if err != nil {
		return nil, err
	}
	if otherNonce, err := r.verify(ctx, rec); err != nil {
		if rec.StartTime == 0 || otherNonce {
			r.release()
			f.dropRecord(rec)
			return nil, err
		}
		go r.reap()
		_ = r.Stop(ctx, 0)
		return nil, fmt.Errorf("%w; stopped it", err)
	}
	go r.reap()
	go r.followLog(f.logPath(rec.ID), true, nil)
	return r, nil
}

// errStaleRecord: the recorded process is gone (its pid is free or another process's).
var errStaleRecord = errors.New("stale runner record")

// attach opens a handle on the record's process and builds its ProcessRunner, without
// starting its reaper. A record whose process is gone, or whose pid now belongs to a
// process that started at another time, is removed (errStaleRecord).
func (f *ProcessFactory) attach(rec *runnerRecord, log logr.Logger) (*ProcessRunner, error) {
	h, err := openProc(rec.PID)
	if err != nil {
		if errors.Is(err, enginepool.ErrProcessNotFound) {
			f.dropRecord(rec)
			return nil, fmt.Errorf("%w: pid %d has exited", errStaleRecord, rec.PID)
		}
		return nil, err
	}
	// The handle was opened first: if the start time matches now, the handle names the
	// recorded process (a later process with this pid would have another start time).
	st, err := procStartTime(rec.PID)
	if err != nil || (rec.StartTime != 0 && st != rec.StartTime) {
		discardHandle(h)
		f.dropRecord(rec)
		if err != nil {
			return nil, fmt.Errorf("%w: pid %d: %v", errStaleRecord, rec.PID, err)
		}
		return nil, fmt.Errorf("%w: pid %d is another process now (started at %d, the runner at %d)",
			errStaleRecord, rec.PID, st, rec.StartTime)
	}
	r := f.newRunner(rec.Model, rec.PID, rec.Dir, log)
	r.handle, r.rec = h, rec
	switch rec.Network {
	case "unix":
		err = r.setAddress(rec.Address, "")
	case "tcp":
		err = r.setAddress("", rec.Address)
	default:
		err = fmt.Errorf("record names network %q", rec.Network)
	}
	if err != nil {
		discardHandle(h)
		return nil, err
	}
	return r, nil
}

// verify proves that the runner answering on the recorded address is the recorded
// one: /health carries the nonce and says loading or ready, /status the pid.
// otherNonce says a runner answered with a nonce of its own.
func (r *ProcessRunner) verify(ctx context.Context, rec *runnerRecord) (otherNonce bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, adoptCheckTimeout)
	defer cancel()
	var h health
	if err := r.call(ctx, http.MethodGet, "/health", nil, &h, http.StatusServiceUnavailable); err != nil {
		return false, fmt.Errorf("health check: %w", err)
	}
	if h.Nonce != rec.Nonce {
		return true, errors.New("the runner on the recorded address answers with another nonce")
	}
	if h.Status != "ready" && h.Status != "loading" {
		return false, fmt.Errorf("the runner is %s", h.Status)
	}
	var st enginepool.RunnerStatus
	if err := r.call(ctx, http.MethodGet, "/status", nil, &st); err != nil {
		return false, fmt.Errorf("status: %w", err)
	}
	if st.PID != rec.PID {
		return false, fmt.Errorf("the runner reports pid %d, the record %d", st.PID, rec.PID)
	}
	return false, nil
}

// release gives up an attached runner whose reaper was never started.
func (r *ProcessRunner) release() {
	discardHandle(r.handle)
	r.transport.CloseIdleConnections()
}

// discardHandle frees a handle nobody waits on.
func discardHandle(h procHandle) {
	go h.wait()
	h.close()
}

// followLog follows a detached runner's log file like readStdout and readStderr
// follow pipes: every line goes to the log and the stderr tail, the first listening
// event to listening (when not nil). It ends once the process is gone (after reading
// what is left) or the runner is detached, and closes stderrEOF.
func (r *ProcessRunner) followLog(path string, fromEnd bool, listening chan<- listenEvent) {
	defer close(r.stderrEOF)
	file, err := os.Open(path)
	if err != nil {
		r.log.Info("Cannot follow the runner's log", "err", err.Error())
		return
	}
	defer file.Close()
	if fromEnd {
		if _, err := file.Seek(0, io.SeekEnd); err != nil {
			r.log.Info("Cannot follow the runner's log", "err", err.Error())
			return
		}
	}
	const maxLine = 64 << 10
	found := listening == nil
	line := func(l string) {
		r.stderr.add(l)
		r.emit("log", l)
		if found || !strings.HasPrefix(strings.TrimSpace(l), "{") {
			return
		}
		var ev listenEvent
		if json.Unmarshal([]byte(l), &ev) == nil && ev.Event == "listening" {
			found = true
			listening <- ev
		}
	}
	var pending []byte
	buf := make([]byte, 32<<10)
	delay, draining := 5*time.Millisecond, false
	for {
		n, err := file.Read(buf)
		if n > 0 {
			pending = append(pending, buf[:n]...)
			for {
				i := bytes.IndexByte(pending, '\n')
				if i < 0 {
					break
				}
				line(strings.TrimRight(string(pending[:i]), "\r"))
				pending = pending[i+1:]
			}
			if len(pending) > maxLine {
				line(string(pending[:maxLine]) + "…")
				pending = pending[:0]
			}
			delay = 5 * time.Millisecond
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			r.log.Info("Reading the runner's log failed", "err", err.Error())
			return
		}
		if draining {
			if len(pending) > 0 {
				line(string(pending))
			}
			return
		}
		select {
		case <-r.gone:
			draining = true
		case <-r.detached:
			return
		case <-time.After(delay):
			delay = min(2*delay, 250*time.Millisecond)
		}
	}
}

// fingerprint hashes everything the engine of a runner depends on: the runner binary
// and the model file (path, size, modification time), the runner's engine flags (the
// ceiling among them), the factory's environment and the restart-relevant fields of
// spec (needsRestart).
func (f *ProcessFactory) fingerprint(runnerPath string, spec enginepool.ModelSpec, engineArgs []string) (string, error) {
	type file struct {
		Path    string `json:"path"`
		Size    int64  `json:"size"`
		ModTime int64  `json:"modTime"`
	}
	stat := func(p string) file {
		fi := file{Path: p}
		if st, err := os.Stat(p); err == nil {
			fi.Size, fi.ModTime = st.Size(), st.ModTime().UnixNano()
		}
		return fi
	}
	b, err := json.Marshal(struct {
		Runner   file     `json:"runner"`
		Model    file     `json:"model"`
		Loopback bool     `json:"loopback"`
		Args     []string `json:"args"`
		Env      []string `json:"env"`
		Engine   any      `json:"engine"`
		Sandbox  string   `json:"sandbox,omitempty"`
	}{stat(runnerPath), stat(spec.Path), f.cfg.Loopback, engineArgs, f.cfg.Env, enginepool.EngineIdentity(spec), f.sandboxIdentity()})
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// newRecord makes the record of a runner about to start (pid and address are filled
// in once it runs) and the state directory if needed.
func (f *ProcessFactory) newRecord(model, fp string, ceilingBytes int64) (*runnerRecord, error) {
	if err := os.MkdirAll(f.cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the runner state directory: %w", err)
	}
	var id, nonce [16]byte
	if _, err := rand.Read(id[:8]); err != nil {
		return nil, err
	}
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, err
	}
	return &runnerRecord{ID: "r" + hex.EncodeToString(id[:8]), Model: model, Fingerprint: fp,
		CeilingBytes: ceilingBytes, Nonce: hex.EncodeToString(nonce[:]), Created: time.Now().UTC()}, nil
}

func (f *ProcessFactory) recordPath(id string) string {
	return filepath.Join(f.cfg.StateDir, id+".json")
}

func (f *ProcessFactory) logPath(id string) string {
	return filepath.Join(f.cfg.StateDir, id+".log")
}

// writeRecord stores rec atomically (temporary file, then rename).
func writeRecord(dir string, rec *runnerRecord) error {
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+rec.ID+".tmp")
	if err != nil {
		return fmt.Errorf("recording the runner: %w", err)
	}
	_, err = tmp.Write(append(b, '\n'))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, rec.ID+".json"))
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("recording the runner: %w", err)
	}
	return nil
}

// readRecords reads every record of the state directory. Files that are not valid
// records are removed: no runner could ever be adopted through them.
func (f *ProcessFactory) readRecords() ([]*runnerRecord, error) {
	paths, err := filepath.Glob(filepath.Join(f.cfg.StateDir, "r*.json"))
	if err != nil {
		return nil, err
	}
	var recs []*runnerRecord
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("reading runner record %s: %w", p, err)
		}
		var rec runnerRecord
		id := strings.TrimSuffix(filepath.Base(p), ".json")
		if json.Unmarshal(b, &rec) != nil || rec.ID != id || rec.PID <= 0 || rec.Nonce == "" {
			os.Remove(p)
			os.Remove(f.logPath(id))
			continue
		}
		recs = append(recs, &rec)
	}
	return recs, nil
}

// dropRecord removes a record, its log and its runner's socket directory.
func (f *ProcessFactory) dropRecord(rec *runnerRecord) {
	os.Remove(f.recordPath(rec.ID))
	os.Remove(f.logPath(rec.ID))
	// Only a directory this package made: an absolute path named mf*.
	if filepath.IsAbs(rec.Dir) && strings.HasPrefix(filepath.Base(rec.Dir), "mf") {
		os.RemoveAll(rec.Dir)
	}
}

// claim marks a record as taken by this factory; false when it already was.
func (f *ProcessFactory) claim(id string) bool {
	f.claimMu.Lock()
	defer f.claimMu.Unlock()
	if f.claimed[id] {
		return false
	}
	f.claimed[id] = true
	return true
}

func (f *ProcessFactory) unclaim(id string) {
	f.claimMu.Lock()
	defer f.claimMu.Unlock()
	delete(f.claimed, id)
}
