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
func (p *Pool) Run(ctx context.Context) error {
	p.enforcer.run(ctx)
	d := p.cfg.DrainTimeout + p.cfg.AbortWaitTimeout + p.cfg.StopTimeout + p.cfg.SettleTimeout + 5*time.Second
	sctx, cancel := p.enforcer.clock.withDeadline(context.Background(), d, "shutting down the engine pool")
	defer cancel()
	if p.cfg.KeepRunnersOnExit {
		kept, err := p.Detach(sctx)
		p.log.Info("Engine pool stopped; runners left running for the next agent", "runners", kept)
		return err
	}
	return p.Close(sctx)
}

// enforcer is the memory enforcer: its poll loop measures, asks decide.Enforce
// (state.enforce applies the verdict: unloads, aborts, the hot budget) and pushes
// the limits to every runner. Its level and counters are in the state.
type enforcer struct {
	deps
	st       *state
	meter    meter
	hot      hotBudget
	unloader unloader
}

// run is Run's loop; it returns when ctx ends.
func (en enforcer) run(ctx context.Context) {
	for {
		en.poll()
		due := en.clock.Now().Add(en.interval())
	wait:
		for {
			d := due.Sub(en.clock.Now())
			if d <= 0 {
				break
			}
			t := en.clock.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C():
				break wait
			case <-en.wake.now:
				t.Stop()
				break wait
			case <-en.wake.active:
				t.Stop()
				if soon := en.st.view(query{}).lastPoll.Add(en.cfg.PollActive); soon.Before(due) {
					due = soon
				}
			}
		}
	}
}

// interval is the adaptive poll interval, shortened to the next idle expiry.
func (en enforcer) interval() time.Duration {
	return decide.NextPoll(en.st.view(query{decide: true}).snap, decide.Intervals{
		Active: en.cfg.PollActive, Idle: en.cfg.PollIdle, Empty: en.cfg.PollEmpty})
}

// poll is one enforcer pass: measure, decide and apply (state.enforce), then push
// limits to every runner and abort what the decision aborts, outside the lock.
func (en enforcer) poll() {
	measured := en.meter.footprints()
	v := en.st.enforce(measured)
	en.unloader.start(v.unloads)
	if v.shrinkHot {
		// Hot tiers are what goes first under hard pressure: shrinking them costs no
		// request and no reload (their states are on the SSD as well).
		en.log.Info("Shrinking the prompt cache hot tiers under memory pressure", "level", string(v.level), "hotBytes", v.hotReclaim)
	}
	for _, g := range v.overCeiling {
		en.log.Info("Runner is over its own ceiling", "model", g.name, "footprintBytes", g.footprint,
			"ceilingBytes", g.ceiling, "reservedBytes", g.reservation, "hotBudgetBytes", g.hotBudget, "runtimeBytes", g.runtime)
	}
	if v.level != v.prev {
		en.log.Info("Memory pressure changed", "from", string(v.prev), "to", string(v.level), "usageBytes", measured)
		for _, o := range v.observers {
			o.PressureChanged(v.prev, v.level)
		}
	}
	// Budgets that shrink first (and before any abort), then the ones that grow.
	en.hot.push(v.decreases)
	en.hot.push(v.increases)
	var wg sync.WaitGroup
	wg.Go(en.meter.statuses)
	for _, ps := range v.pushes {
		en.clock.goCall(&wg, en.cfg.RunnerCallTimeout, "pushing limits to "+ps.name, func(ctx context.Context) {
			if err := ps.r.SetLimits(ctx, ps.l); err != nil {
				en.log.V(2).Info("Pushing limits failed", "model", ps.name, "err", err.Error())
			}
		})
	}
	for _, a := range v.aborts {
		en.clock.goCall(&wg, en.cfg.RunnerCallTimeout, "aborting "+a.name, func(ctx context.Context) {
			n, err := a.r.Abort(ctx)
			en.log.Info("Aborted in-flight requests under memory pressure", "model", a.name, "level", string(v.level), "aborted", n, "err", errString(err))
		})
	}
	wg.Wait()
}

// enforced is what one enforcer verdict leaves the poll to do outside the lock.
type enforced struct {
	prev, level          PressureLevel
	shrinkHot            bool
	hotReclaim           int64
	decreases, increases []budgetPush
	unloads              []teardownJob
	aborts               []runnerRef
	pushes               []limitPush
	overCeiling          []overCeiling
	observers            []Observer
}

// limitPush is one runner's limits to push.
type limitPush struct {
	name string
	r    Runner
	l    Limits
}

// overCeiling is a runner found over its own ceiling, for the log.
type overCeiling struct {
	name                                                string
	footprint, ceiling, reservation, hotBudget, runtime int64
}

// enforce records the measured usage, asks decide.Enforce for the verdict and
// applies it: the level, the hot shares, the unloads and canceled loads; it returns
// the runners whose requests to abort and the limits to push to every runner.
func (s *state) enforce(measured int64) enforced {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := s.decideSnapshot()
	out := enforced{prev: s.level}
	in := decide.Poll{Measured: measured, OverRun: s.overCeilingRun,
		EmergencyMargin: s.cfg.EmergencyMarginBytes, HotShrunk: s.hotShrunk, HotHeld: s.hotHeld()}
	d := decide.Enforce(snap, in)
	out.level, out.shrinkHot, out.hotReclaim = d.Level, d.ShrinkHot, d.HotReclaim
	s.usage, s.level, s.overCeilingRun, s.lastPoll = measured, d.Level, d.OverRun, snap.Now
	s.hotShrunk = d.HotShrunk
	out.decreases, out.increases = s.hotPlan()
	// The hot shares just planned are part of every runner's own ceiling: the actions
	// are decided on them, so a runner that took its share is not unloaded as over its
	// ceiling by the snapshot from before the plan. Same inputs, same level.
	s.applyActions(decide.Enforce(s.decideSnapshot(), in).Actions, &out)
	for g := range s.engines {
		if g.runner == nil || isClosed(g.stopped) {
			continue
		}
		out.pushes = append(out.pushes, limitPush{g.name, g.runner, Limits{CeilingBytes: g.ownCeiling(), HardLimitBytes: s.ceiling.HardBytes, HostUsedBytes: measured}})
	}
	out.observers = s.observed()
	return out
}

// applyActions applies the enforcer's actions in order: it begins unloads and
// cancels loads, and lists the engines whose in-flight requests must be aborted.
func (s *state) applyActions(actions []decide.Action, out *enforced) {
	unload := func(e *entry, reason UnloadReason) {
		if _, job := s.beginUnload(e, reason); job != nil {
			out.unloads = append(out.unloads, *job)
		}
	}
	var aborts []*engine
	for _, a := range actions {
		e := s.entries[a.Model]
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
			out.overCeiling = append(out.overCeiling, overCeiling{e.spec.Name, g.footprint, g.hostCeiling(), g.reservation, g.hotBudget, g.runtimeBytes})
			unload(e, ReasonOverCeiling)
		case decide.UnloadPressure:
			unload(e, ReasonPressure)
		case decide.UnloadIdle:
			unload(e, ReasonIdle)
		}
	}
	for _, g := range aborts {
		out.aborts = append(out.aborts, runnerRef{g: g, name: g.name, r: g.runner, pid: g.pid})
	}
}

func appendEngine(list []*engine, g *engine) []*engine {
	for _, x := range list {
		if x == g {
			return list
		}
	}
	return append(list, g)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
