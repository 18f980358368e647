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
	var targets []runnerRef
	for _, t := range p.st.view(query{runners: true}).runners {
		if !isClosed(t.g.stopped) {
			targets = append(targets, t)
		}
	}
	out := make([]RunnerCacheClear, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Go(func() {
			rc := RunnerCacheClear{Model: t.name, PID: t.pid}
			before, berr := p.meter.gauge.Process(t.pid)
			cctx, cancel := p.meter.clock.withDeadline(ctx, p.cfg.RunnerCallTimeout, "clearing the cache of "+t.name)
			res, err := t.r.ClearCache(cctx)
			cancel()
			if err != nil {
				rc.Error = err.Error()
			}
			rc.ReportedBytes, rc.EntriesCleared = res.BytesReclaimed, res.EntriesCleared
			if after, aerr := p.meter.gauge.Process(t.pid); berr == nil && aerr == nil {
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
	signal(p.wake.now)
	return rep
}

// RunnerOf is the runner of model (a name or alias) while it is Ready, for the
// admin reads that ask a runner about itself (its prefix events): it takes no lease
// and never loads the model. An unknown model is an UnknownModelError; a model
// without a ready runner an UnavailableError (it holds nothing).
func (p *Pool) RunnerOf(model string) (Runner, error) {
	v := p.st.view(query{model: model})
	if !v.known {
		return nil, &UnknownModelError{Model: model}
	}
	if v.runner == nil {
		return nil, &UnavailableError{Model: v.name, State: v.state, ErrCode: CodeEngineStopped,
			Reason: "the model is not loaded: no runner holds its prefixes", Retry: p.cfg.RetryAfter}
	}
	return v.runner, nil
}
