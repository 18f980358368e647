package modeldeployment

import (
	"context"
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/estimate"
)

// Replicas split across Macs (issue 27). A deployment with maxMacsPerReplica above 1
// gives its replicas a layerMemory, so that the scheduler can place one that fits no
// single Mac as a gang; a gang whose Mac of any shard is lost is deleted at once and
// replaced, so it is placed again whole: a partial gang never stays bound.

// splits reports whether md's replicas may span several Macs.
func splits(md *v1alpha1.ModelDeployment) bool {
	return md.Spec.Placement.MaxMacsPerReplica > 1
}

// layerMemoryFor is the layerMemory of a replica reserving reservation bytes, from the
// estimate's division over the layers, scaled so that one shard holding every layer
// reserves at least the reservation (the reservation may be an override or bounded by
// a measurement rather than the estimate itself). Worker is not scaled: it is a
// process's own baseline and compute buffer. pipeline is the head's llama contexts
// (engine splitPipeline, at least 1): each context beyond the first adds a compute
// buffer to the head and to every worker, and the head's contexts their output buffers
// (estimate.Layered.Pipelined; docs/split-model.md, Pipelining), on top of the scaled
// figures, since a replica placed whole on one Mac holds one context and
// keeps its reservation. Nil when the estimate has no layers.
func layerMemoryFor(l estimate.Layered, reservation int64, pipeline int) *v1alpha1.LayerMemory {
	whole := l.Head + l.Layers*l.PerLayer
	if l.Layers <= 0 || whole <= 0 || reservation <= 0 {
		return nil
	}
	scale := float64(reservation) / float64(whole)
	head := min(int64(float64(l.Head)*scale+0.5), reservation)
	perLayer := max((reservation-head+l.Layers-1)/l.Layers, 1)
	headExtra, workerExtra := l.Pipelined(pipeline)
	return &v1alpha1.LayerMemory{
		Layers:   int32(min(l.Layers, 4096)),
		PerLayer: *resource.NewQuantity(perLayer, resource.BinarySI),
		Head:     *resource.NewQuantity(head+headExtra, resource.BinarySI),
		Worker:   *resource.NewQuantity(l.Worker+workerExtra, resource.BinarySI),
	}
}

// gangBroken reports whether mr is bound as a gang with a shard on a Mac that is not
// Ready (or gone), or a shard whose Mac's agent reports it Failed in status.shards (its
// worker process died, or could not load): the gang cannot serve, and the deployment
// replaces it whole.
func gangBroken(mr *v1alpha1.ModelReplica, ready func(node string) bool) bool {
	if mr.Spec.Split == nil {
		return false
	}
	for _, s := range mr.Spec.Split.Shards {
		if !ready(s.Node) || shardFailed(mr, s.Node) {
			return true
		}
	}
	return false
}

// shardFailed reports whether status.shards says the shard of mr on node failed.
func shardFailed(mr *v1alpha1.ModelReplica, node string) bool {
	for _, st := range mr.Status.Shards {
		if st.Node == node {
			return st.Phase == v1alpha1.ReplicaFailed
		}
	}
	return false
}

// replicaNodes are the Macs a bound replica runs on: its node, then its other shards'.
func replicaNodes(mr *v1alpha1.ModelReplica) []string {
	if mr.Spec.Split == nil {
		return []string{mr.Spec.NodeName}
	}
	nodes := make([]string, 0, len(mr.Spec.Split.Shards))
	for _, s := range mr.Spec.Split.Shards {
		nodes = append(nodes, s.Node)
	}
	return nodes
}

// onNode reports whether mr runs on node: bound to it, or a shard of it is.
func onNode(mr *v1alpha1.ModelReplica, node string) bool {
	return mr.Spec.NodeName == node || slices.Contains(replicaNodes(mr), node)
}

// replicaNodesReady says whether every Mac mr runs on (its node, and each shard's)
// exists and is Ready.
func (r *Reconciler) replicaNodesReady(ctx context.Context, mr *v1alpha1.ModelReplica) (bool, error) {
	up, err := r.nodeReady(ctx, mr.Spec.NodeName)
	if err != nil || !up || mr.Spec.Split == nil {
		return up, err
	}
	var readErr error
	broken := gangBroken(mr, func(node string) bool {
		ok, err := r.nodeReady(ctx, node)
		if err != nil && readErr == nil {
			readErr = err
		}
		return ok
	})
	return !broken, readErr
}
