package metal

import (
	"context"
	"sync"
	"time"
)

// PressureLevel is the memory enforcer's verdict at one poll.
type PressureLevel string

const (
	// PressureOK: usage below the soft watermark; nothing to do.
	PressureOK PressureLevel = "ok"
	// PressureSoft: at or above soft; loads pause above the soft watermark, idle
	// LRU models are evicted while more than one non-pinned model is loaded.
	PressureSoft PressureLevel = "soft"
	// PressureHard: at or above hard; loads in progress are aborted, idle victims
	// evicted, else the LRU busy model's requests aborted (it stays loaded).
	PressureHard PressureLevel = "hard"
	// PressureEmergency: at or above the ceiling for two polls in a row, or over it
	// by the emergency margin; everything in flight is aborted and non-pinned
	// models unloaded.
	PressureEmergency PressureLevel = "emergency"
)

// Rank orders levels: ok 0, soft 1, hard 2, emergency 3.
func (l PressureLevel) Rank() int {
	switch l {
	case PressureSoft:
		return 1
	case PressureHard:
		return 2
	case PressureEmergency:
		return 3
	}
	return 0
}

func (l PressureLevel) atLeast(o PressureLevel) bool { return l.Rank() >= o.Rank() }

// classifyPressure is the pure level decision. overRun counts consecutive polls at
// or above the ceiling before this one; it returns the level and the new count.
func classifyPressure(usage int64, c Ceiling, emergencyMargin int64, overRun int) (PressureLevel, int) {
	if usage >= c.Bytes {
		overRun++
	} else {
		overRun = 0
	}
	switch {
	case usage >= c.Bytes+emergencyMargin || overRun >= 2:
		return PressureEmergency, overRun
	case usage >= c.HardBytes:
		return PressureHard, overRun
	case usage >= c.SoftBytes:
		return PressureSoft, overRun
	}
	return PressureOK, overRun
}

// Run drives the memory enforcer until ctx ends, then unloads every model (or, with
// Config.KeepRunnersOnExit, detaches the runners that can outlive it) and returns. Polls are adaptive — PollActive while anything loads, serves or unloads
// or pressure is not ok, PollIdle with models loaded, PollEmpty without — and are
// brought forward by loads, unloads and the first request on an idle engine.
func (p *Pool) Run(ctx context.Context) error {
	for {
		p.poll()
		due := p.clock.Now().Add(p.pollInterval())
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
				return p.shutdown()
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

func (p *Pool) shutdown() error {
	d := p.cfg.DrainTimeout + p.cfg.AbortWaitTimeout + p.cfg.StopTimeout + p.cfg.SettleTimeout + 5*time.Second
	ctx, cancel := p.withDeadline(context.Background(), d, "shutting down the engine pool")
	defer cancel()
	if p.cfg.KeepRunnersOnExit {
		kept, err := p.Detach(ctx)
		p.log.Info("Engine pool stopped; runners left running for the next agent", "runners", kept)
		return err
	}
	return p.Close(ctx)
}

// pollInterval is the adaptive interval, shortened to the next idle expiry.
func (p *Pool) pollInterval() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	active := p.level != PressureOK
	loaded := false
	next := time.Duration(-1)
	for _, e := range p.entries {
		switch {
		case e.state.transient():
			active = true
		case e.state == StateReady:
			loaded = true
			if e.eng.inUse > 0 {
				active = true
			} else if t := e.idleTimeout(p.cfg.IdleTimeout); t > 0 {
				left := max(e.lastUsed.Add(t).Sub(now), 10*time.Millisecond)
				if next < 0 || left < next {
					next = left
				}
			}
		}
	}
	interval := p.cfg.PollEmpty
	switch {
	case active:
		interval = p.cfg.PollActive
	case loaded:
		interval = p.cfg.PollIdle
	}
	if next >= 0 && next < interval {
		interval = next
	}
	return interval
}

// poll is one enforcer pass: measure, classify, push limits to every runner, act.
func (p *Pool) poll() {
	measured := p.measurePool()

	p.mu.Lock()
	now := p.clock.Now()
	prev := p.level
	level, run := classifyPressure(measured, p.ceiling, p.cfg.EmergencyMarginBytes, p.overCeilingRun)
	p.usage, p.level, p.overCeilingRun, p.lastPoll = measured, level, run, now
	// Hot tiers are what goes first under hard pressure: shrinking them costs no
	// request and no reload (their states are on the SSD as well).
	hotReclaim := int64(0)
	switch {
	case level.atLeast(PressureHard):
		if !p.hotShrunk {
			hotReclaim = p.hotHeldLocked()
			p.log.Info("Shrinking the prompt cache hot tiers under memory pressure", "level", string(level), "hotBytes", hotReclaim)
		}
		p.hotShrunk = true
	case level == PressureOK:
		p.hotShrunk = false
	}
	decreases, increases := p.planHotLocked()
	aborts := p.actLocked(level, measured, now, hotReclaim)
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
	p.pushBudgets(decreases)
	p.pushBudgets(increases)
	var wg sync.WaitGroup
	wg.Go(p.refreshCacheStats)
	for _, ps := range pushes {
		wg.Go(func() {
			ctx, cancel := p.withDeadline(context.Background(), p.cfg.RunnerCallTimeout, "pushing limits to "+ps.name)
			defer cancel()
			if err := ps.r.SetLimits(ctx, ps.l); err != nil {
				p.log.V(2).Info("Pushing limits failed", "model", ps.name, "err", err.Error())
			}
		})
	}
	for _, g := range aborts {
		wg.Go(func() {
			ctx, cancel := p.withDeadline(context.Background(), p.cfg.RunnerCallTimeout, "aborting "+g.name)
			defer cancel()
			n, err := g.runner.Abort(ctx)
			p.log.Info("Aborted in-flight requests under memory pressure", "model", g.name, "level", string(level), "aborted", n, "err", errString(err))
		})
	}
	wg.Wait()
}

// actLocked applies the level's actions: it starts unloads and cancels loads itself
// and returns the engines whose in-flight requests must be aborted.
func (p *Pool) actLocked(level PressureLevel, usage int64, now time.Time, hotReclaim int64) []*engine {
	var aborts []*engine
	pending := int64(0)
	nonPinned := 0
	for g := range p.engines {
		if g.tearingDown {
			pending += max(g.footprint, g.reservation)
		}
	}
	for _, e := range p.entries {
		if e.state == StateReady && e.spec.Residency != Pinned {
			nonPinned++
		}
	}

	// A runner over its own ceiling by more than 10% is a pressure victim.
	for _, e := range p.entries {
		g := e.eng
		if e.state != StateReady || g == nil || g.reservation <= 0 || g.overCeiling {
			continue
		}
		if g.footprint > g.ownCeiling() {
			g.overCeiling = true
			p.log.Info("Runner is over its own ceiling", "model", e.spec.Name, "footprintBytes", g.footprint,
				"ceilingBytes", g.ownCeiling(), "reservedBytes", g.reservation, "hotBudgetBytes", g.hotBudget)
			if g.inUse > 0 {
				aborts = append(aborts, g)
			}
			p.startUnloadLocked(e, ReasonOverCeiling)
			pending += max(g.footprint, g.reservation)
		}
	}

	switch level {
	case PressureEmergency:
		for _, e := range p.entries {
			switch {
			case e.state == StateLoading:
				p.startUnloadLocked(e, ReasonPressure)
			case (e.state == StateReady || e.state == StateDraining) && e.eng != nil && e.eng.inUse > 0:
				aborts = appendEngine(aborts, e.eng)
			}
			if e.state == StateReady && e.spec.Residency != Pinned {
				p.startUnloadLocked(e, ReasonPressure)
			}
		}
	case PressureHard:
		for _, e := range p.entries {
			if e.state == StateLoading {
				p.startUnloadLocked(e, ReasonPressure)
			}
		}
		if need := usage - p.ceiling.SoftBytes - pending - hotReclaim; need > 0 {
			if v := p.pickVictimLocked(nil, need); v != nil {
				p.startUnloadLocked(v, ReasonPressure)
			} else if busy := p.lruBusyLocked(); busy != nil {
				aborts = appendEngine(aborts, busy.eng)
			}
		}
	case PressureSoft:
		if pending == 0 && nonPinned > 1 {
			if v := p.pickVictimLocked(nil, 0); v != nil {
				p.startUnloadLocked(v, ReasonPressure)
			}
		}
	}

	// Idle expiry: OnDemand models without a lease past their idle timeout.
	for _, e := range p.entries {
		if e.state != StateReady || e.eng.inUse > 0 {
			continue
		}
		if t := e.idleTimeout(p.cfg.IdleTimeout); t > 0 && now.Sub(e.lastUsed) >= t {
			p.startUnloadLocked(e, ReasonIdle)
		}
	}
	return aborts
}

// lruBusyLocked is the least recently used Ready entry with requests in flight.
func (p *Pool) lruBusyLocked() *entry {
	var best *entry
	for _, e := range p.entries {
		if e.state != StateReady || e.eng == nil || e.eng.inUse == 0 {
			continue
		}
		if best == nil || e.lastUsed.Before(best.lastUsed) ||
			(e.lastUsed.Equal(best.lastUsed) && e.spec.Name < best.spec.Name) {
			best = e
		}
	}
	return best
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
