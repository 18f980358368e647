package modeldeployment

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// replicaSpec is what a new replica of a deployment is made of: its access, the
// current template and its hash, the memory it reserves and, for a split deployment,
// that memory divided over the model's layers.
type replicaSpec struct {
	access replicaAccess
	tmpl   v1alpha1.ModelReplicaTemplate
	hash   string
	q      resource.Quantity
	layers *v1alpha1.LayerMemory
}

// sync ends the drains that are over, then creates, drains and deletes replicas as
// plan decides, unless the cache does not show the previous pass's changes yet (their
// watch events wake the deployment again). It returns how long the drains still
// running may take (0: none).
func (r *Reconciler) sync(ctx context.Context, md *v1alpha1.ModelDeployment, spec replicaSpec, canCreate bool,
	replicas []v1alpha1.ModelReplica, current func(*v1alpha1.ModelReplica) bool) (time.Duration, error) {
	logger := log.FromContext(ctx)
	inv, err := r.inventory(ctx, replicas, current)
	if err != nil {
		return 0, err
	}
	now := r.Clock.Now()
	drainLeft, err := r.endDrains(ctx, md, inv.draining, now)
	if err != nil {
		return 0, err
	}
	if !r.expect.satisfied(md.UID, now, inv.listed, inv.live) {
		logger.V(2).Info("Waiting for the cache to show the last changes")
		return drainLeft, nil
	}
	desired := int(desiredReplicas(md))
	if len(inv.infos) > desired { // some may go: rank them by their Mac's memory pressure
		r.rankPressure(ctx, replicas, inv.infos)
	}
	act := plan(desired, inv.infos)
	if !canCreate {
		act.Create = 0
	}
	if act.Create == 0 && len(act.Delete) == 0 {
		return drainLeft, nil
	}

	// Removals first, so that a rolling step never has more than desired+maxSurge
	// replicas. A drained replica no longer counts as live, like a deleted one.
	deleted, deleteErr := r.removeReplicas(ctx, inv.byName, act.Delete, now)
	if deleteErr != nil {
		r.expect.expect(md.UID, now, nil, deleted)
		return drainLeft, deleteErr
	}
	created, createErr := r.createReplicas(ctx, md, spec, act.Create)
	r.expect.expect(md.UID, now, created, deleted)
	if len(created) > 0 || len(deleted) > 0 {
		logger.V(2).Info("Scaled replicas", "created", created, "removed", deleted, "templateHash", spec.hash, "reservation", spec.q.String())
	}
	return drainLeft, createErr
}

// replicaInventory is a deployment's replicas as sync sees them: the names listed and
// live (neither deleted nor draining), what plan needs to know of the live ones, and
// the draining ones.
type replicaInventory struct {
	listed, live sets.Set[string]
	infos        []replicaInfo
	draining     []*v1alpha1.ModelReplica
	byName       map[string]*v1alpha1.ModelReplica
}

// inventory sorts replicas into live and draining ones and describes the live ones
// for plan, reading whether a split replica's Macs are all Ready.
func (r *Reconciler) inventory(ctx context.Context, replicas []v1alpha1.ModelReplica, current func(*v1alpha1.ModelReplica) bool) (replicaInventory, error) {
	inv := replicaInventory{listed: sets.New[string](), live: sets.New[string](), byName: map[string]*v1alpha1.ModelReplica{}}
	for i := range replicas {
		mr := &replicas[i]
		inv.listed.Insert(mr.Name)
		if mr.DeletionTimestamp != nil {
			continue
		}
		if mr.Spec.Drain != nil {
			// Leaving, like a replica being deleted: not counted by plan.
			inv.draining = append(inv.draining, mr)
			continue
		}
		inv.live.Insert(mr.Name)
		inv.byName[mr.Name] = mr
		info := replicaInfo{Name: mr.Name, Created: mr.CreationTimestamp.Time,
			Current: current(mr), Ready: isReady(mr), Bound: mr.Spec.NodeName != ""}
		if mr.Spec.Split != nil {
			up, err := r.replicaNodesReady(ctx, mr)
			if err != nil {
				return replicaInventory{}, err
			}
			info.BrokenGang = !up
		}
		inv.infos = append(inv.infos, info)
	}
	return inv, nil
}

// removeReplicas starts the removal of the replicas named, in order, and stops at the
// first error; it returns the names whose removal started.
func (r *Reconciler) removeReplicas(ctx context.Context, byName map[string]*v1alpha1.ModelReplica, names []string, now time.Time) (deleted []string, err error) {
	for _, name := range names {
		if err := r.startRemoval(ctx, byName[name], now); err != nil {
			return deleted, err
		}
		deleted = append(deleted, name)
	}
	return deleted, nil
}

// createReplicas creates n replicas of spec in slow-start batches; it returns the
// names of those created.
func (r *Reconciler) createReplicas(ctx context.Context, md *v1alpha1.ModelDeployment, spec replicaSpec, n int) ([]string, error) {
	var (
		mu      sync.Mutex
		created []string
	)
	err := slowStartBatch(n, func() error {
		mr, err := newReplica(md, spec, r.Scheme)
		if err == nil && splits(md) {
			mr.Spec.LayerMemory = spec.layers.DeepCopy()
		}
		if err != nil {
			return err
		}
		if err := r.Client.Create(ctx, mr); err != nil {
			return fmt.Errorf("creating a replica: %w", err)
		}
		mu.Lock()
		created = append(created, mr.Name)
		mu.Unlock()
		return nil
	})
	return created, err
}

// newReplica is a replica of md's current template reserving spec's memory.
func newReplica(md *v1alpha1.ModelDeployment, spec replicaSpec, scheme *runtime.Scheme) (*v1alpha1.ModelReplica, error) {
	mr := &v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: fmt.Sprintf("%s-%s-", md.Name, spec.hash),
			Namespace:    md.Namespace,
			Labels:       map[string]string{v1alpha1.LabelDeployment: md.Name, v1alpha1.LabelTemplateHash: spec.hash},
		},
		Spec: v1alpha1.ModelReplicaSpec{Template: *spec.tmpl.DeepCopy(), TemplateHash: spec.hash, MemoryReservation: spec.q.DeepCopy()},
	}
	setAccess(&mr.Spec, spec.access)
	if err := controllerutil.SetControllerReference(md, mr, scheme); err != nil {
		return nil, fmt.Errorf("owning replica by %s: %w", klog.KObj(md), err)
	}
	return mr, nil
}
