// Package rebuild runs the gateway's snapshots of what it reads from the API server
// (the routing table, the teams' keys, the TokenBudgets) in step with their
// informers: a rebuild at once, then one on every change.
package rebuild

import (
	"context"
	"sync/atomic"
	"time"
)

// Loop runs rebuild once at once and then on every kick until ctx ends; a failed
// rebuild is reported and retried a second later. synced is set by the first
// rebuild that succeeds.
func Loop(ctx context.Context, kick <-chan struct{}, rebuild func(context.Context) error,
	failed func(error), synced *atomic.Bool) {
	retry := time.NewTimer(time.Second)
	retry.Stop() // armed only after a failure
	defer retry.Stop()
	for {
		if err := rebuild(ctx); err != nil {
			failed(err)
			retry.Reset(time.Second)
		} else {
			synced.Store(true)
		}
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-retry.C:
		}
	}
}
