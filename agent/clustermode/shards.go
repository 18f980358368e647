package clustermode

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/splitlink"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/informers"
)

// workerShards is the agent's view of the replicas split across Macs in which its Mac
// holds a worker shard (issue 27). The agent's replica cache selects spec.nodeName,
// which is the head's Mac; the scheduler labels a gang's replica for each worker
// shard's Mac (v1alpha1.ShardLabel), and this cache selects this Mac's label, the one
// selector besides spec.nodeName the node authorizer lets it list and watch by.
type workerShards struct {
	node  string
	cache cache.Cache
	mu    sync.Mutex
	// workers are the local workers (shardSync): their loopback addresses and
	// secrets, by replica "namespace/name".
	workers map[string]splitlink.Worker
}

// watchWorkerShards makes the cache (not started).
func watchWorkerShards(rc *rest.Config, scheme *runtime.Scheme, node string, log logr.Logger) (*workerShards, error) {
	sel := labels.SelectorFromSet(labels.Set{v1alpha1.ShardLabel(node): v1alpha1.ShardLabelWorker})
	c, err := cache.New(rc, cache.Options{Scheme: scheme, ByObject: map[client.Object]cache.ByObject{
		&v1alpha1.ModelReplica{}: {Label: sel},
	}, NewInformer: informers.NewInformer(informers.Options{Log: log})})
	if err != nil {
		return nil, fmt.Errorf("creating the worker shard cache: %w", err)
	}
	return &workerShards{node: node, cache: c, workers: map[string]splitlink.Worker{}}, nil
}

// start watches the replicas (GetInformer) and runs the cache until ctx ends.
func (w *workerShards) start(ctx context.Context) error {
	if _, err := w.cache.GetInformer(ctx, &v1alpha1.ModelReplica{}, cache.BlockUntilSynced(false)); err != nil {
		return fmt.Errorf("watching the replicas with a worker shard on this Mac: %w", err)
	}
	if err := w.cache.Start(ctx); err != nil && ctx.Err() == nil {
		return fmt.Errorf("the worker shard cache stopped: %w", err)
	}
	return nil
}

// setWorker records the local worker of replica ns/name (a zero address forgets it).
func (w *workerShards) setWorker(ns, name string, wk splitlink.Worker) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if wk.Addr == "" {
		delete(w.workers, ns+"/"+name)
		return
	}
	w.workers[ns+"/"+name] = wk
}

// lookup is the split link's splitlink.Lookup: the replica as this Mac's cache shows
// it when it holds a worker shard on this Mac, and its local worker (none until the
// worker runs: the head's Mac is then answered 503 split_worker_unavailable).
func (w *workerShards) lookup(ctx context.Context, ns, name string) (*v1alpha1.ModelReplica, splitlink.Worker) {
	var mr v1alpha1.ModelReplica
	if err := w.cache.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &mr); err != nil {
		return nil, splitlink.Worker{}
	}
	if !slices.Contains(mr.Spec.Split.WorkerNodes(), w.node) {
		return nil, splitlink.Worker{}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return &mr, w.workers[ns+"/"+name]
}

// handler is the split link's endpoint on this Mac's agent.
func (w *workerShards) handler(log logr.Logger) *splitlink.Handler {
	return &splitlink.Handler{Self: w.node, Lookup: w.lookup, Log: log}
}
