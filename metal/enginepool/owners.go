package enginepool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/macfleet/macfleet/internal/devicegauge"
	"github.com/macfleet/macfleet/metal/enginepool/decide"
)

// The owner goroutines of the pool's transient states, and their tools. Every
// Loading state has one loader.run, every Draining and Stopping state one
// unloader.teardown; each has a deadline on the injected clock (ownerClock), takes
// the state's lock only through the state's methods — one step, one plan — and
// never holds it across a start, a stop, a wait or a measurement.
//
//	loader.run            the owner of one Loading state
//	  admit               decide.Admit round by round (state.admit): evict, wait, measure, refuse
//	  startRunner         start the runner under its ceiling and wait until it serves
//	  finish              Ready, or Failed and torn down, or refused (state.load)
//	unloader.teardown     the owner of one Draining and Stopping state (state.teardown)
//	  drain               wait for the leases, abort what remains, wait for the requests
//	  stopAndSettle       stop and reap the runner; the settle barrier
//	  release             the reservation back, the report (stepRelease)
//	unloader.watch        a runner's crash becomes a teardown that ends in Failed

// deps is what every effect of the pool works with besides the state: the config,
// the injected clock, the log, the memory gauge and the enforcer's wake channels.
type deps struct {
	cfg   Config
	clock ownerClock
	log   logr.Logger
	gauge Gauge
	wake  wakes
}

// wakes are the enforcer's wake channels: now asks for a poll at once, active for
// one within PollActive (a request started).
type wakes struct {
	now, active chan struct{}
}

// loader brings models in: it is the owner goroutine of each load — admission, the
// runner's start, then Ready or the teardown of a failed start. It holds the runner
// factory and the admission semaphore, and takes the state's lock only through the
// state's methods, never across a start, a wait or a measurement.
type loader struct {
	deps
	st      *state
	factory RunnerFactory
	// admitting serializes admissions (not serving): a one-slot semaphore.
	admitting chan struct{}
	meter     meter
	unloader  unloader
}

// start hands the job to its owner goroutine.
func (l loader) start(job loadJob) {
	go l.run(job)
}

// run is the owner of one Loading state: admission, then the runner, then Ready
// or a teardown.
func (l loader) run(job loadJob) {
	a := job.attempt
	defer a.cancel(context.Canceled)
	ctx, stop := l.clock.withDeadline(job.ctx, l.cfg.LoadTimeout, "loading "+job.spec.Name)
	defer stop()

	g, err := l.admit(ctx, job)
	if err != nil {
		l.finish(ctx, loadStep{kind: loadRefused, job: job, err: err})
		return
	}
	err = l.startRunner(ctx, job, g)
	var fp int64
	if err == nil {
		fp, _ = l.gauge.Process(g.pid)
	}
	l.finish(ctx, loadStep{kind: loadEnded, job: job, eng: g, footprint: fp, err: err})
}

// admit asks decide.Admit, round by round, whether the job's entry may load — evicting
// idle models first, waiting for unloads in progress, or refusing — and on success
// returns the new engine, its reservation committed.
//
// Admissions are serialized (loads wait for each other, serving does not); the
// state's lock is only taken to decide, never across a measurement or an eviction.
func (l loader) admit(ctx context.Context, job loadJob) (*engine, error) {
	spec := job.spec
	// A model that can never fit says so at once, before waiting for other admissions
	// (whose wait a pressure cancel could otherwise turn into insufficient_memory).
	if ceiling := l.st.view(query{}).ceiling; spec.EstimatedBytes > ceiling.Bytes {
		return nil, &ModelTooLargeError{Model: spec.Name, EstimatedBytes: spec.EstimatedBytes, Ceiling: ceiling}
	}
	select {
	case l.admitting <- struct{}{}:
	case <-ctx.Done():
		return nil, l.canceled(ctx, spec.Name)
	}
	defer func() { <-l.admitting }()

	round := admitRound{ctx: ctx, job: job, req: decide.AdmitRequest{Model: spec.Name, Estimate: spec.EstimatedBytes, Measured: -1}}
	for {
		r := l.st.admit(round)
		if r.victim != "" {
			l.log.V(2).Info("Evicting to admit a model", "model", spec.Name, "victim", r.victim,
				"projectedBytes", r.projected, "softBytes", r.softBytes)
			l.unloader.start(r.evict)
		}
		if r.eng != nil || r.err != nil {
			return r.eng, r.err
		}
		if r.wait != nil {
			select {
			case <-r.wait:
			case <-ctx.Done():
				return nil, l.canceled(ctx, spec.Name)
			}
		}
		round.req.Evicted = round.req.Evicted || r.victim != ""
		round.req.Measured = l.meter.footprints()
	}
}

// canceled is the error of an admission that ctx ended: the cancel error of the load
// when someone canceled it, else ctx's cause.
func (l loader) canceled(ctx context.Context, model string) error {
	if err := l.st.view(query{model: model}).cancelErr; err != nil {
		return err
	}
	return fmt.Errorf("admitting %s: %w", model, context.Cause(ctx))
}

// startRunner starts the admitted engine's runner under its ceiling (runnerCeiling),
// records it for measurement, and waits until it serves. The lock is not held
// while starting or waiting.
func (l loader) startRunner(ctx context.Context, job loadJob, g *engine) error {
	runner, err := l.factory.Start(ctx, job.spec, g.startCeiling)
	if err != nil {
		return err
	}
	l.st.load(loadStep{kind: loadStarted, job: job, eng: g, runner: runner})
	return runner.WaitReady(ctx)
}

// finish applies the load's end — Ready, Failed, or refused — and does what is left
// outside the lock: the log, the observers, the runner's watcher or the teardown of
// a failed start.
func (l loader) finish(ctx context.Context, step loadStep) {
	a, name := step.job.attempt, step.job.spec.Name
	step.cause = context.Cause(ctx)
	r := l.st.load(step)
	d := l.clock.Since(a.started)
	switch {
	case r.ready:
		l.log.V(2).Info("Model loaded", "model", name, "reservedBytes", step.eng.reservation, "duration", d)
		go l.unloader.watch(step.eng)
	case r.teardown != nil:
		l.log.Info("Model load did not complete", "model", name, "err", r.err.Error())
	default:
		l.log.V(2).Info("Model load refused", "model", name, "err", r.err.Error())
	}
	for _, o := range r.observers {
		o.LoadFinished(LoadEvent{Model: name, Duration: d, Err: a.err})
	}
	if r.teardown != nil {
		l.unloader.teardown(*r.teardown)
	}
}

// unloader stops engines: it is the owner goroutine of each teardown — drain, stop,
// settle, release, report — for unloads and crashes alike. It takes the state's lock
// only through the state's teardown steps, between its waits, never across one.
type unloader struct {
	deps
	st *state
}

// start starts an owner goroutine for each job.
func (u unloader) start(jobs []teardownJob) {
	for _, job := range jobs {
		go u.teardown(job)
	}
}

// teardown is the single owner of an engine's Draining and Stopping states:
// drain → abort → wait for request goroutines → stop → settle → release the
// reservation → report. Every wait has a deadline; the state's lock is never held
// across any of them.
func (u unloader) teardown(job teardownJob) {
	start := u.clock.Now()
	log := u.log.WithValues("model", job.g.name, "reason", string(job.plan.reason))
	aborted := u.drain(job, log)
	report := u.stopAndSettle(job, log)

	// 4. Release the reservation, only now; 5. report.
	r := u.st.teardown(teardownStep{kind: stepRelease, job: job, report: report, aborted: aborted, start: start})
	if report != nil {
		log.V(2).Info("Model unloaded", "outcome", string(report.Outcome), "freedBytes", report.FreedBytes,
			"residentBytes", report.ResidentBytes, "duration", report.Duration)
		for _, o := range r.observers {
			o.Unloaded(job.g.name, *report)
		}
	}
}

// drain is step 1 of a teardown: wait for leases up to the plan's drain deadline,
// abort what remains, wait for the request goroutines to return. It returns how
// many generations the abort ended.
func (u unloader) drain(job teardownJob, log logr.Logger) int {
	g, plan := job.g, job.plan
	aborted := 0
	released := u.awaitReleased(job, plan.drain)
	if !released && !plan.crashed && g.runner != nil {
		ctx, cancel := u.clock.withDeadline(context.Background(), u.cfg.RunnerCallTimeout, "aborting "+g.name)
		n, err := g.runner.Abort(ctx)
		cancel()
		aborted = n
		if err != nil {
			log.Info("Aborting in-flight requests failed", "err", err.Error())
		}
	}
	if !released {
		if !u.awaitReleased(job, u.cfg.AbortWaitTimeout) {
			log.Info("Requests still hold the engine after abort; stopping it anyway")
		}
	}
	return aborted
}

// awaitReleased waits up to d (on the injected clock) for the engine's leases to
// reach zero.
func (u unloader) awaitReleased(job teardownJob, d time.Duration) bool {
	r := u.st.teardown(teardownStep{kind: stepAwait, job: job})
	return r.released == nil || u.clock.waitFor(r.released, d)
}

// stopAndSettle is steps 2 and 3 of a teardown: invalidate the engine's handles,
// reset its counters, stop and reap the runner, and wait for the settle barrier.
// It returns the unload's report without its timing (nil when no runner had
// started).
func (u unloader) stopAndSettle(job teardownJob, log logr.Logger) *UnloadReport {
	plan := job.plan
	r := u.st.teardown(teardownStep{kind: stepStop, job: job})
	if r.runner == nil {
		return nil
	}
	resident := r.resident
	if !plan.crashed {
		if fp, err := u.gauge.Process(r.pid); err == nil && fp > 0 {
			resident = fp
		}
	}
	pre, preErr := u.gauge.Host()
	devPre, devOK := deviceBefore(context.Background(), u.cfg.DeviceGauge)
	ctx, cancel := u.clock.withDeadline(context.Background(), u.cfg.StopTimeout, "stopping "+job.g.name)
	if err := r.runner.Stop(ctx, u.cfg.StopGrace); err != nil {
		log.Info("Stopping the runner failed", "pid", r.pid, "err", err.Error())
	}
	cancel()
	outcome, freed := Indeterminate, resident
	if !plan.crashed && preErr == nil {
		outcome, freed = u.settle(job.e, r.activity, pre.UsedBytes, resident)
	}
	report := &UnloadReport{Reason: plan.reason, FreedBytes: max(freed, 0), ResidentBytes: resident, Outcome: outcome}
	if devOK {
		report.DeviceFreedBytes = deviceFreed(context.Background(), u.cfg.DeviceGauge, devPre, u.clock.Sleep,
			deviceSettleInterval, int(u.cfg.SettleTimeout/deviceSettleInterval))
	}
	return report
}

// watch turns an unexpected runner exit into a teardown that ends in Failed.
func (u unloader) watch(g *engine) {
	select {
	case <-g.runner.Exited():
	case <-g.stopped:
		return
	}
	cause := g.runner.ExitErr()
	if cause == nil {
		cause = errors.New("the runner exited unexpectedly")
	}
	job := teardownJob{g.entry, g, teardownPlan{reason: ReasonCrash, final: StateFailed, cause: cause, crashed: true}}
	if r := u.st.teardown(teardownStep{kind: stepCrash, job: job}); !r.crashed {
		return
	}
	u.log.Info("Runner exited unexpectedly", "model", g.name, "pid", g.pid, "err", cause.Error())
	u.teardown(job)
}

// settle is the settle barrier of an unload (ENGINE_POOL.md, step 3): it waits for
// the host gauge to give back what a stopped runner held, sampling at once and then
// as decide.Settle says, until it says the barrier is done. pre is the host's used
// memory sampled before the runner was stopped and resident the runner's footprint;
// activity is the state's activity count when pre was taken (anything that loaded or
// took a request since makes the gauge unattributable). A TimedOut barrier wakes the
// enforcer. It runs in the unload's owner goroutine and holds no lock while waiting:
// it asks the state only whether anything else ran meanwhile.
func (u unloader) settle(self *entry, activity uint64, pre, resident int64) (SettleOutcome, int64) {
	s := decide.SettleSample{Deadline: u.clock.Now().Add(u.cfg.SettleTimeout), Interval: u.cfg.SettleInterval,
		Pre: pre, Resident: resident, ToleranceFloor: u.cfg.SettleToleranceBytes}
	busy := teardownStep{kind: stepBusy, job: teardownJob{e: self}, activity: activity}
	for {
		s.OthersBusy, s.HostOK = u.st.teardown(busy).busy, false
		if !s.OthersBusy {
			if hm, err := u.gauge.Host(); err == nil {
				s.Used, s.HostOK = hm.UsedBytes, true
			}
		}
		s.Now = u.clock.Now()
		step := decide.Settle(s)
		if step.Kind == decide.SettleDone {
			if step.Outcome == TimedOut {
				signal(u.wake.now)
			}
			return step.Outcome, step.Freed
		}
		s.Freed = step.Freed
		t := u.clock.NewTimer(step.Wait)
		<-t.C()
	}
}

// An unload's freed device memory, on a machine whose accelerators have memory of
// their own (docs/architecture.md, "Two memory domains"). The host gauge settles the
// footprint; the cards are read from their driver before the runner stops and after it
// is gone, so that the report holds what the card got back — the runner's buffers, its
// CUDA context and the backend's pool alike — not what the runner said it held.

// deviceBefore reads the cards' used memory before a runner stops: ok false where the
// pool has no device gauge (a Mac) or the reading failed.
func deviceBefore(ctx context.Context, g devicegauge.Gauge) (used int64, ok bool) {
	if g == nil {
		return 0, false
	}
	cards, err := g.Cards(ctx)
	if err != nil || len(cards) == 0 {
		return 0, false
	}
	return devicegauge.Used(cards), true
}

// deviceSettleInterval spaces the cards' readings after a runner is reaped. The
// driver releases a process's memory as the process goes, so by the first reading the
// drop is normally whole and the second only confirms it; spaced at the host
// barrier's 250 ms that confirmation made an unload 1.7x slower than the peer's on an
// H100. A reading through the driver's tool itself takes tens of milliseconds.
const deviceSettleInterval = 50 * time.Millisecond

// deviceFreed is how far the cards' used memory fell from before: read every interval
// until two readings agree within slack (the driver has finished releasing the
// process's memory) or attempts run out. Never negative: another process allocating
// meanwhile shows as nothing freed, not as a debt.
func deviceFreed(ctx context.Context, g devicegauge.Gauge, before int64, wait func(time.Duration), interval time.Duration,
	attempts int) int64 {
	const slack = 1 << 20
	last := int64(-1)
	for range max(attempts, 1) {
		cards, err := g.Cards(ctx)
		if err != nil {
			break
		}
		used := devicegauge.Used(cards)
		if last >= 0 && abs64(used-last) <= slack {
			last = used
			break
		}
		last = used
		wait(interval)
	}
	if last < 0 {
		return 0
	}
	return max(before-last, 0)
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// ownerClock is the pool's injected clock with the deadlines and bounded waits of
// the owner goroutines on it, so that they follow a fake clock in tests.
type ownerClock struct{ clock.WithTicker }

// withDeadline derives a context that the clock cancels after d.
func (c ownerClock) withDeadline(parent context.Context, d time.Duration, what string) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	t := c.NewTimer(d)
	go func() {
		select {
		case <-t.C():
			cancel(fmt.Errorf("%s: deadline of %s exceeded: %w", what, d, context.DeadlineExceeded))
		case <-ctx.Done():
			t.Stop()
		}
	}()
	return ctx, func() { cancel(context.Canceled) }
}

// goCall runs call in a goroutine of wg, with a context the clock cancels after d:
// one runner call of a batch that the caller waits for (what names the call in the
// deadline's error).
func (c ownerClock) goCall(wg *sync.WaitGroup, d time.Duration, what string, call func(ctx context.Context)) {
	wg.Go(func() {
		ctx, cancel := c.withDeadline(context.Background(), d, what)
		defer cancel()
		call(ctx)
	})
}

// waitFor waits for ch up to d on the clock. It reports whether ch closed.
func (c ownerClock) waitFor(ch <-chan struct{}, d time.Duration) bool {
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	default:
	}
	if d <= 0 {
		return false
	}
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C():
		return false
	}
}
