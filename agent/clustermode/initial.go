package clustermode

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// InitialSync is closed once every replica bound to the node when the agent started
// has settled: loaded (or failed to), registered when OnDemand, or failed to
// download. Runners of an earlier agent that no replica claimed by then can be stopped.
func (s *Syncer) InitialSync() <-chan struct{} { return s.initialDone }

// watchInitial closes initialDone once the replicas of keys have settled.
func (s *Syncer) watchInitial(ctx context.Context, keys []string) {
	t := s.opts.Clock.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		snap := s.opts.Pool.Snapshot()
		pending := keys[:0:0]
		for _, k := range keys {
			if !s.settled(ctx, k, snap) {
				pending = append(pending, k)
			}
		}
		if keys = pending; len(keys) == 0 {
			s.log.V(1).Info("Initial sync done")
			close(s.initialDone)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// settled says whether replica key needs nothing more of a runner that an earlier
// agent may have left: it is gone, loaded or failed, registered as OnDemand, or its
// download failed.
func (s *Syncer) settled(ctx context.Context, key string, snap enginepool.Snapshot) bool {
	ns, name, _ := toolscache.SplitMetaNamespaceKey(key)
	var obj v1alpha1.ModelReplica
	var mr *v1alpha1.ModelReplica
	if err := s.opts.Cache.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &obj); err == nil {
		mr = &obj
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	local := s.replicas[key]
	d := desiredOf(mr, local, s.opts.NodeName)
	if d == DesiredDrained {
		return true // never loaded again: no earlier runner to adopt
	}
	switch observedOf(local, findModel(snap, key)) {
	case ObservedLoaded, ObservedLoadFailed, ObservedDownloadFailed, ObservedUnloading:
		return true
	case ObservedStandby:
		return (d == DesiredOnDemand && !local.adopting && !s.recorded[key]) || d == DesiredAbsent
	case ObservedNotRegistered:
		return d == DesiredAbsent
	}
	return false
}
