package enginepool

import (
	"context"
	"sync"
	"time"

	"github.com/macfleet/macfleet/metal/enginepool/decide"
)

// PressureLevel is the memory enforcer's verdict at one poll (decide.ClassifyPressure).
type PressureLevel = decide.PressureLevel

const (
	PressureOK        = decide.PressureOK
	PressureSoft      = decide.PressureSoft
	PressureHard      = decide.PressureHard
	PressureEmergency = decide.PressureEmergency
)

// Run drives the memory enforcer until ctx ends, then unloads every model (or, with
// Config.KeepRunnersOnExit, detaches the runners that can outlive it) and returns. Polls are adaptive — PollActive while anything loads, serves or unloads
// or pressure is not ok, PollIdle with models loaded, PollEmpty without — and are
// brought forward by loads, unloads and the first request on an idle engine.
func (p *Pool) Run(ctx context.Context) error { return p.enforcer.run(ctx) }

// enforcer is the memory enforcer: its poll loop measures, asks decide.Enforce and
// applies the verdict — unloads, aborts, the hot budget — and pushes the limits to
// every runner. It holds a pointer back to the pool; its level and counters are
// pool state, under the pool mutex.
type enforcer struct{ p *Pool }

// run is Run's loop.
func (en enforcer) run(ctx context.Context) error {
	p := en.p
	for {
		en.poll()
		due := p.clock.Now().Add(en.interval())
	wait:
		for {
			d := due.Sub(p.clock.Now())
			if d <= 0 {
				break
			}
			t := p.clock.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return en.shutdown()
			case <-t.C():
				break wait
			case <-p.wakeNow:
				t.Stop()
				break wait
			case <-p.wakeActive:
				t.Stop()
				p.mu.Lock()
				soon := p.lastPoll.Add(p.cfg.PollActive)
				p.mu.Unlock()
				if soon.Before(due) {
					due = soon
				}
			}
		}
	}
}

// shutdown ends Run: it unloads every model, or detaches the runners that can
// outlive the pool when Config.KeepRunnersOnExit says so.
func (en enforcer) shutdown() error {
	p := en.p
	d := p.cfg.DrainTimeout + p.cfg.AbortWaitTimeout + p.cfg.StopTimeout + p.cfg.SettleTimeout + 5*time.Second
	ctx, cancel := p.clock.withDeadline(context.Background(), d, "shutting down the engine pool")
	defer cancel()
	if p.cfg.KeepRunnersOnExit {
		kept, err := p.Detach(ctx)
		p.log.Info("Engine pool stopped; runners left running for the next agent", "runners", kept)
		return err
	}
	return p.Close(ctx)
}

// interval is the adaptive poll interval, shortened to the next idle expiry.
func (en enforcer) interval() time.Duration {
	p := en.p
	p.mu.Lock()
	defer p.mu.Unlock()
	return decide.NextPoll(p.decideSnapshotLocked(), decide.Intervals{
		Active: p.cfg.PollActive, Idle: p.cfg.PollIdle, Empty: p.cfg.PollEmpty})
}

// poll is one enforcer pass: measure, decide (decide.Enforce), apply, then push
// limits to every runner and abort what the decision aborts, outside the lock.
func (en enforcer) poll() {
	p := en.p
	measured := p.meter.footprints()

	p.mu.Lock()
	snap := p.decideSnapshotLocked()
	prev := p.level
	in := decide.Poll{Measured: measured, OverRun: p.overCeilingRun,
		EmergencyMargin: p.cfg.EmergencyMarginBytes, HotShrunk: p.hotShrunk, HotHeld: p.hot.heldLocked()}
	d := decide.Enforce(snap, in)
	level := d.Level
	p.usage, p.level, p.overCeilingRun, p.lastPoll = measured, level, d.OverRun, snap.Now
	if d.ShrinkHot {
		// Hot tiers are what goes first under hard pressure: shrinking them costs no
		// request and no reload (their states are on the SSD as well).
		p.log.Info("Shrinking the prompt cache hot tiers under memory pressure", "level", string(level), "hotBytes", d.HotReclaim)
	}
	p.hotShrunk = d.HotShrunk
	decreases, increases := p.hot.planLocked()
	// The hot shares just planned are part of every runner's own ceiling: the actions
	// are decided on them, so a runner that took its share is not unloaded as over its
	// ceiling by the snapshot from before the plan. Same inputs, same level.
	d.Actions = decide.Enforce(p.decideSnapshotLocked(), in).Actions
	aborts := en.applyLocked(d.Actions)
	type push struct {
		name string
		r    Runner
		l    Limits
	}
	var pushes []push
	for g := range p.engines {
		if g.runner == nil || isClosed(g.stopped) {
			continue
		}
		pushes = append(pushes, push{g.name, g.runner, Limits{CeilingBytes: g.ownCeiling(), HardLimitBytes: p.ceiling.HardBytes, HostUsedBytes: measured}})
	}
	obs := p.observersLocked()
	p.mu.Unlock()

	if level != prev {
		p.log.Info("Memory pressure changed", "from", string(prev), "to", string(level), "usageBytes", measured)
		for _, o := range obs {
			o.PressureChanged(prev, level)
		}
	}
	// Budgets that shrink first (and before any abort), then the ones that grow.
	p.hot.push(decreases)
	p.hot.push(increases)
	var wg sync.WaitGroup
	wg.Go(p.meter.statuses)
	for _, ps := range pushes {
		p.clock.goCall(&wg, p.cfg.RunnerCallTimeout, "pushing limits to "+ps.name, func(ctx context.Context) {
			if err := ps.r.SetLimits(ctx, ps.l); err != nil {
				p.log.V(2).Info("Pushing limits failed", "model", ps.name, "err", err.Error())
			}
		})
	}
	for _, g := range aborts {
		p.clock.goCall(&wg, p.cfg.RunnerCallTimeout, "aborting "+g.name, func(ctx context.Context) {
			n, err := g.runner.Abort(ctx)
			p.log.Info("Aborted in-flight requests under memory pressure", "model", g.name, "level", string(level), "aborted", n, "err", errString(err))
		})
	}
	wg.Wait()
}

// applyLocked applies the enforcer's actions in order: it starts unloads
// and cancels loads itself and returns the engines whose in-flight requests must be
// aborted.
func (en enforcer) applyLocked(actions []decide.Action) []*engine {
	p := en.p
	var aborts []*engine
	for _, a := range actions {
		e := p.entries[a.Model]
		if e == nil {
			continue
		}
		switch a.Kind {
		case decide.AbortRequests:
			if e.eng != nil {
				aborts = appendEngine(aborts, e.eng)
			}
		case decide.UnloadOverCeiling:
			g := e.eng
			g.overCeiling = true
			p.log.Info("Runner is over its own ceiling", "model", e.spec.Name, "footprintBytes", g.footprint,
				"ceilingBytes", g.ownCeiling(), "reservedBytes", g.reservation, "hotBudgetBytes", g.hotBudget)
			p.unloader.startLocked(e, ReasonOverCeiling)
		case decide.UnloadPressure:
			p.unloader.startLocked(e, ReasonPressure)
		case decide.UnloadIdle:
			p.unloader.startLocked(e, ReasonIdle)
		}
	}
	return aborts
}

func appendEngine(list []*engine, g *engine) []*engine {
	for _, x := range list {
		if x == g {
			return list
		}
	}
	return append(list, g)
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
