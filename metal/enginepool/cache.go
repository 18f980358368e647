package enginepool

import (
	"context"
	"slices"
	"strings"
	"sync"
)

// CacheClearReport is what a prompt-cache clear gave back across the runners.
type CacheClearReport struct {
	// BytesReclaimed is the sum of the measured footprint drops.
	BytesReclaimed int64              `json:"bytes_reclaimed"`
	Runners        []RunnerCacheClear `json:"runners"`
}

// RunnerCacheClear is one runner's part of a CacheClearReport.
type RunnerCacheClear struct {
	Model string `json:"model"`
	PID   int    `json:"pid"`
	// BytesReclaimed is the drop of the runner's footprint measured from outside
	// (never negative); ReportedBytes is the runner's own figure.
	BytesReclaimed int64  `json:"bytes_reclaimed"`
	ReportedBytes  int64  `json:"reported_bytes"`
	EntriesCleared int    `json:"entries_cleared"`
	Error          string `json:"error,omitempty"`
}

// ClearCache drops the prompt cache of every live runner — including engines whose
// model was removed or is draining, so no cache outlives its owner — and measures
// what each gave back as the drop in its footprint.
func (p *Pool) ClearCache(ctx context.Context) CacheClearReport {
	type target struct {
		name string
		r    Runner
		pid  int
	}
	p.mu.Lock()
	var targets []target
	for g := range p.engines {
		if g.runner != nil && !isClosed(g.stopped) {
			targets = append(targets, target{g.name, g.runner, g.pid})
		}
	}
	p.mu.Unlock()

	out := make([]RunnerCacheClear, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			rc := RunnerCacheClear{Model: t.name, PID: t.pid}
			before, berr := p.gauge.Process(t.pid)
			cctx, cancel := p.clock.withDeadline(ctx, p.cfg.RunnerCallTimeout, "clearing the cache of "+t.name)
			res, err := t.r.ClearCache(cctx)
			cancel()
			if err != nil {
				rc.Error = err.Error()
			}
			rc.ReportedBytes, rc.EntriesCleared = res.BytesReclaimed, res.EntriesCleared
			if after, aerr := p.gauge.Process(t.pid); berr == nil && aerr == nil {
				rc.BytesReclaimed = max(before-after, 0)
			}
			out[i] = rc
		})
	}
	wg.Wait()
	rep := CacheClearReport{Runners: out}
	for _, rc := range out {
		rep.BytesReclaimed += rc.BytesReclaimed
	}
	slices.SortFunc(rep.Runners, func(a, b RunnerCacheClear) int { return strings.Compare(a.Model, b.Model) })
	signal(p.wakeNow)
	return rep
}

// RunnerOf is the runner of model (a name or alias) while it is Ready, for the
// admin reads that ask a runner about itself (its prefix events): it takes no lease
// and never loads the model. An unknown model is an UnknownModelError; a model
// without a ready runner an UnavailableError (it holds nothing).
func (p *Pool) RunnerOf(model string) (Runner, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.lookupLocked(model)
	if e == nil {
		return nil, &UnknownModelError{Model: model}
	}
	if e.state != StateReady || e.eng == nil || e.eng.runner == nil || isClosed(e.eng.stopped) {
		return nil, &UnavailableError{Model: e.spec.Name, State: e.state, ErrCode: CodeEngineStopped,
			Reason: "the model is not loaded: no runner holds its prefixes", Retry: p.cfg.RetryAfter}
	}
	return e.eng.runner, nil
}
