package clustermode

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/splitlink"
	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// shardSyncInterval is how often the worker shards are reconciled and reported.
const shardSyncInterval = 500 * time.Millisecond

// workerShardOf is the pure rule of which shard of mr this Mac runs as a worker: its
// shard of spec.split when it is not the head's; nil otherwise (and for a replica
// being deleted).
func workerShardOf(mr *v1alpha1.ModelReplica, node string) *v1alpha1.ReplicaShard {
	if mr.DeletionTimestamp != nil || mr.Spec.Split == nil || mr.Spec.NodeName == node {
		return nil
	}
	for i := range mr.Spec.Split.Shards[1:] {
		if s := &mr.Spec.Split.Shards[i+1]; s.Node == node {
			return s
		}
	}
	return nil
}

// shardEntryName is the pool entry of the worker shard of replica ns/name: no served
// name of a replica has this form, so no request resolves to it.
func shardEntryName(ns, name string) string { return "split-worker:" + ns + "/" + name }

// shardPhase is the shard's phase from its pool entry (nil: not registered yet).
func shardPhase(m *enginepool.ModelSnapshot, fetchErr error) v1alpha1.ReplicaPhase {
	switch {
	case fetchErr != nil:
		return v1alpha1.ReplicaFailed
	case m == nil:
		return v1alpha1.ReplicaDownloading
	case m.State == enginepool.StateReady:
		return v1alpha1.ReplicaRunning
	case m.State == enginepool.StateFailed:
		return v1alpha1.ReplicaFailed
	}
	return v1alpha1.ReplicaLoading
}

// shardRetires is the pure rule of when this Mac unloads its worker shard of mr for
// good: the replica drains (spec.drain) and the head's agent reports the head's runner
// unloaded for it (v1alpha1.ModelReplica.DrainReported). Until then the head's runner
// may still be finishing requests across the shards.
func shardRetires(mr *v1alpha1.ModelReplica) bool { return mr.DrainReported() }

// shardEntry is this Mac's entry of status.shards for a shard in phase with pool entry
// m: the footprint the pool measures of the shard's process and the pool's report of
// its last unload.
func shardEntry(node string, phase v1alpha1.ReplicaPhase, m *enginepool.ModelSnapshot) v1alpha1.ShardStatus {
	e := v1alpha1.ShardStatus{Node: node, Phase: phase}
	if m != nil && m.LastUnload != nil {
		e.LastUnload = unloadReport(*m.LastUnload)
	}
	if m != nil && m.ResidentBytes > 0 {
		e.Resident = resource.NewQuantity(m.ResidentBytes, resource.BinarySI)
	}
	if m != nil && m.PeakBytes > 0 {
		e.Peak = resource.NewQuantity(m.PeakBytes, resource.BinarySI)
	}
	return e
}

// shardSync runs this Mac's worker shards under its engine pool: for each replica of
// the worker shard cache with a shard here, it fetches the model into the store,
// registers a Pinned pool entry (enginepool.ModelSpec.SplitWorker) reserving the
// shard's memory and loads it, hands the worker's loopback address to the split link,
// and writes its own entry of status.shards (phase, resident, peak, lastUnload). A
// shard of a drained replica is retired (shardRetires: unloaded through the pool's
// settle barrier, its report kept for lastUnload); a shard no longer wanted is removed
// from the pool.
type shardSync struct {
	node   string
	shards *workerShards
	// peers carry a worker's output to the next worker shard's Mac (--next); nil: no
	// worker pushes, each one's output goes back through the head's runner.
	peers  *SplitLinks
	pool   *enginepool.Pool
	store  Store
	status client.StatusClient
	log    logr.Logger

	mu      sync.Mutex
	started map[string]*shardRun // by replica "namespace/name"
}

// shardRun is one worker shard being fetched, loaded or run.
type shardRun struct {
	uid      string
	fetchErr error
	cancel   context.CancelFunc
	// retiring: shardRetires holds; the fetch and load are canceled.
	retiring bool
}

func (s *shardSync) run(ctx context.Context) error {
	t := time.NewTicker(shardSyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		s.reconcile(ctx)
	}
}

// reconcile starts and stops worker shards as the cache says and reports each.
func (s *shardSync) reconcile(ctx context.Context) {
	var list v1alpha1.ModelReplicaList
	if err := s.shards.cache.List(ctx, &list); err != nil {
		return // not synced yet
	}
	want := map[string]*v1alpha1.ModelReplica{}
	for i := range list.Items {
		if mr := &list.Items[i]; workerShardOf(mr, s.node) != nil {
			want[mr.Namespace+"/"+mr.Name] = mr
		}
	}
	s.mu.Lock()
	for key, r := range s.started {
		if mr, ok := want[key]; !ok || string(mr.UID) != r.uid {
			r.cancel()
			delete(s.started, key)
			ns, name, _ := toolscache.SplitMetaNamespaceKey(key)
			s.shards.setWorker(ns, name, splitlink.Worker{})
			if s.peers != nil {
				s.peers.Close(key)
			}
			var unknown *enginepool.UnknownModelError
			if _, err := s.pool.Remove(shardEntryName(ns, name)); err != nil && !errors.As(err, &unknown) {
				s.log.Error(err, "Removing a worker shard", "replica", key)
			}
		}
	}
	for key, mr := range want {
		r, ok := s.started[key]
		switch {
		case shardRetires(mr):
			s.retireLocked(key, mr, r)
		case !ok:
			s.startLocked(ctx, key, mr)
		}
	}
	s.mu.Unlock()
	snap := s.pool.Snapshot()
	for key, mr := range want {
		s.report(ctx, key, mr, snap)
	}
}

// startLocked fetches the shard's model and loads its worker, in the background.
func (s *shardSync) startLocked(ctx context.Context, key string, mr *v1alpha1.ModelReplica) {
	rctx, cancel := context.WithCancel(ctx)
	r := &shardRun{uid: string(mr.UID), cancel: cancel}
	s.started[key] = r
	shard := *workerShardOf(mr, s.node)
	src := mr.Spec.Template.Model
	// A worker shard followed by another pushes its output there (--next), over a
	// peer link of this Mac's: made now, so that the address holds for the shard's life.
	var next string
	var nextErr error
	if to := mr.Spec.Split.NextWorker(s.node); to != "" && s.peers != nil {
		next, nextErr = s.peers.Addr(mr, to)
	}
	go func() {
		path, err := fetchShard(rctx, s.store, mr.Namespace, src, shard)
		if err == nil {
			err = nextErr
		}
		if err == nil {
			err = s.pool.Register(enginepool.ModelSpec{Name: shardEntryName(mr.Namespace, mr.Name), Path: path,
				Namespace: mr.Namespace, Residency: enginepool.Pinned, SplitWorker: true, SplitNext: next,
				Engine: mr.Spec.Template.Engine.Settings, EstimatedBytes: shard.Memory.Value()})
			if err != nil {
				s.log.Error(err, "Registering a worker shard", "replica", key)
			}
		}
		if err != nil {
			s.mu.Lock()
			r.fetchErr = err
			s.mu.Unlock()
			return
		}
		if err := s.pool.Load(rctx, shardEntryName(mr.Namespace, mr.Name)); err != nil && rctx.Err() == nil {
			s.log.Info("Loading a worker shard failed", "replica", key, "err", err.Error())
		}
	}()
}

// layerStore is a Store that fetches, of a model stored in parts, only the parts
// holding a worker shard's layers (store.Store.FetchLayers).
type layerStore interface {
	FetchLayers(ctx context.Context, namespace, source, sha256 string, lr store.LayerRange, progress func(done, total int64)) (string, error)
}

// fetchShard fetches the model of a worker shard: only the parts its layers need
// when st can tell, else the whole model.
func fetchShard(ctx context.Context, st Store, ns string, src v1alpha1.ModelSource, shard v1alpha1.ReplicaShard) (string, error) {
	if ls, ok := st.(layerStore); ok {
		lr := store.LayerRange{First: int(shard.FirstLayer), Last: int(shard.LastLayer)}
		return ls.FetchLayers(ctx, ns, src.Source, src.SHA256, lr, func(int64, int64) {})
	}
	return st.Fetch(ctx, ns, src.Source, src.SHA256, func(int64, int64) {})
}

// retireLocked stops the shard's fetch and load (r, nil when none was started) and
// retires its pool entry: the pool drains and stops the worker, waits for the settle
// barrier and keeps the unload's report. Called at every tick while the shard
// retires (Retire is idempotent), so an entry registered meanwhile is retired too.
func (s *shardSync) retireLocked(key string, mr *v1alpha1.ModelReplica, r *shardRun) {
	if r == nil {
		r = &shardRun{uid: string(mr.UID), cancel: func() {}}
		s.started[key] = r
	}
	if !r.retiring {
		r.retiring = true
		r.cancel()
	}
	var unknown *enginepool.UnknownModelError
	if _, err := s.pool.Retire(shardEntryName(mr.Namespace, mr.Name)); err != nil && !errors.As(err, &unknown) {
		s.log.Error(err, "Retiring a worker shard", "replica", key)
	}
}

// report hands the worker's address to the split link and writes this Mac's entry
// of the replica's status.shards when it changed.
func (s *shardSync) report(ctx context.Context, key string, mr *v1alpha1.ModelReplica, snap enginepool.Snapshot) {
	entryName := shardEntryName(mr.Namespace, mr.Name)
	m := findModel(snap, entryName)
	s.mu.Lock()
	var fetchErr error
	retiring := false
	if r := s.started[key]; r != nil {
		fetchErr, retiring = r.fetchErr, r.retiring
	}
	s.mu.Unlock()
	phase := shardPhase(m, fetchErr)
	if retiring {
		phase = v1alpha1.ReplicaDraining
	}
	var wk splitlink.Worker
	if phase == v1alpha1.ReplicaRunning {
		if rn, err := s.pool.RunnerOf(entryName); err == nil {
			if w, ok := rn.(interface{ Addr() string }); ok {
				wk.Addr = w.Addr()
			}
			if w, ok := rn.(interface{ Secret() []byte }); ok {
				wk.Secret = w.Secret()
			}
		}
	}
	s.shards.setWorker(mr.Namespace, mr.Name, wk)
	entry := shardEntry(s.node, phase, m)
	if sameShardEntry(mr.Status.Shards, entry) {
		return
	}
	upd := mr.DeepCopy()
	replaced := false
	for i := range upd.Status.Shards {
		if upd.Status.Shards[i].Node == s.node {
			upd.Status.Shards[i], replaced = entry, true
		}
	}
	if !replaced {
		upd.Status.Shards = append(upd.Status.Shards, entry)
	}
	// A conflict (the head wrote meanwhile) is retried at the next tick, from the cache.
	if err := s.status.Status().Update(ctx, upd); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		s.log.Error(err, "Writing this Mac's entry of status.shards", "replica", key)
	}
}

// sameShardEntry reports whether shards already hold entry (quantities by value,
// resident within 1 MiB so that a small drift writes nothing).
func sameShardEntry(shards []v1alpha1.ShardStatus, entry v1alpha1.ShardStatus) bool {
	for _, s := range shards {
		if s.Node != entry.Node {
			continue
		}
		return s.Phase == entry.Phase && closeQty(s.Resident, entry.Resident, 1<<20) && closeQty(s.Peak, entry.Peak, 1<<20) &&
			equality.Semantic.DeepEqual(s.LastUnload, entry.LastUnload)
	}
	return false
}

func closeQty(a, b *resource.Quantity, tolerance int64) bool {
	if a == nil || b == nil {
		return a == b
	}
	d := a.Value() - b.Value()
	return d <= tolerance && d >= -tolerance
}
