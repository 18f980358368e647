// Package endpoints publishes each ModelDeployment as a Kubernetes Service: a
// selector-less ClusterIP Service (port 8080, "http") and EndpointSlices listing
// the agents of the Macs that hold a Ready replica, marked not ready as soon as
// their Mac is not Ready.
package endpoints

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/endpoints/addressproof"
)

// ControllerName names the controller (metrics, logs) and the reporter of its Events.
const ControllerName = "endpoints"

// EventServiceConflict: a Service with the deployment's Service name exists and
// belongs to something else; the controller leaves it (and the slices) alone.
const EventServiceConflict = "ServiceConflict"

// EventAddressUnverified (Warning, on the MacNode): a handshake with the Mac's agent
// address did not prove that the listener there holds the Mac's fleet certificate,
// so the address is in no tenant's EndpointSlice. One Event per failed handshake
// (they back off, see addressproof.DefaultPolicy).
const EventAddressUnverified = "AddressUnverified"

// AddressVerifier proves that a Mac's agent address is the Mac's own
// (*addressproof.Prober: a TLS handshake with the Mac's fleet certificate). readySince
// is when the Mac last became Ready; probed says whether a handshake ran in the call.
type AddressVerifier interface {
	Verify(ctx context.Context, node, addr string, readySince time.Time) (v addressproof.Verdict, probed bool)
}

// Reconciler keeps each ModelDeployment's Service and EndpointSlices.
type Reconciler struct {
	// Client reads from the manager's cache and writes Services and EndpointSlices.
	// Default: mgr.GetClient().
	Client client.Client
	// Recorder emits ServiceConflict Events. Default: mgr.GetEventRecorder(ControllerName).
	Recorder events.EventRecorder
	// APIReader reads the API server's own Service and EndpointSlices, which the
	// manager's cache does not hold, to keep its addresses out of tenants'
	// EndpointSlices. Default: mgr.GetAPIReader().
	APIReader client.Reader
	// Addresses proves each Mac's agent address before it is published. Required:
	// the manager gives an *addressproof.Prober with its own client certificate.
	Addresses AddressVerifier

	reserved reservedAddresses
}

// CacheByObject restricts the manager's caches of Services and EndpointSlices to
// the ones this controller owns, so that it neither holds nor is woken by every
// Service and EndpointSlice in the cluster. Merge it into the manager's
// cache.Options.ByObject (the controller works without it, caching more).
func CacheByObject() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&corev1.Service{}:            {Label: labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedByValue})},
		&discoveryv1.EndpointSlice{}: {Label: labels.SelectorFromSet(labels.Set{discoveryv1.LabelManagedBy: ManagedBy})},
	}
}

// +kubebuilder:rbac:groups=macfleet.dev,resources=modeldeployments,verbs=get;list;watch
// +kubebuilder:rbac:groups=macfleet.dev,resources=modeldeployments/finalizers,verbs=update
// +kubebuilder:rbac:groups=macfleet.dev,resources=modelreplicas,verbs=get;list;watch
// +kubebuilder:rbac:groups=macfleet.dev,resources=macnodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager registers the controller and the spec.nodeName index of
// ModelReplicas with mgr, filling in unset fields.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return r.setup(mgr, nil)
}

// setup registers the controller; wrap, when set, wraps the reconciler the
// controller calls (tests observe each pass through it).
func (r *Reconciler) setup(mgr ctrl.Manager, wrap func(reconcile.Reconciler) reconcile.Reconciler) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder(ControllerName)
	}
	if r.APIReader == nil {
		r.APIReader = mgr.GetAPIReader()
	}
	if r.Addresses == nil {
		return fmt.Errorf("the endpoints controller needs an AddressVerifier (Addresses) to prove Macs' agent addresses")
	}
	if err := IndexReplicaNodeName(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return err
	}
	var rec reconcile.Reconciler = r
	if wrap != nil {
		rec = wrap(r)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		For(&v1alpha1.ModelDeployment{}).
		Owns(&corev1.Service{}).
		Owns(&discoveryv1.EndpointSlice{}).
		Watches(&v1alpha1.ModelReplica{},
			handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
				return deploymentOf(o.(*v1alpha1.ModelReplica))
			}),
			builder.WithPredicates(replicaPredicate())).
		Watches(&v1alpha1.MacNode{},
			handler.EnqueueRequestsFromMapFunc(r.deploymentsOnNode),
			builder.WithPredicates(nodePredicate())).
		Complete(rec)
}

// IndexReplicaNodeName indexes ModelReplicas by spec.nodeName
// (v1alpha1.ReplicaNodeNameField) in the manager's cache. Several controllers need
// this index; a second registration of it is not an error.
func IndexReplicaNodeName(ctx context.Context, indexer client.FieldIndexer) error {
	err := indexer.IndexField(ctx, &v1alpha1.ModelReplica{}, v1alpha1.ReplicaNodeNameField, func(o client.Object) []string {
		if n := o.(*v1alpha1.ModelReplica).Spec.NodeName; n != "" {
			return []string{n}
		}
		return nil
	})
	// client-go refuses a second indexer of the same name with this message; the
	// index it refers to is the one wanted.
	if err != nil && strings.Contains(err.Error(), "indexer conflict") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("indexing ModelReplicas by %s: %w", v1alpha1.ReplicaNodeNameField, err)
	}
	return nil
}

// deploymentOf is the deployment a replica belongs to: its controller, else its
// deployment label.
func deploymentOf(mr *v1alpha1.ModelReplica) []reconcile.Request {
	name := mr.Labels[v1alpha1.LabelDeployment]
	if ref := metav1.GetControllerOf(mr); ref != nil && ref.Kind == deploymentKind.Kind && ref.APIVersion == deploymentKind.GroupVersion().String() {
		name = ref.Name
	}
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: mr.Namespace, Name: name}}}
}

// deploymentsOnNode maps a MacNode to the deployments with replicas bound to it.
func (r *Reconciler) deploymentsOnNode(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1alpha1.ModelReplicaList
	if err := r.Client.List(ctx, &list, client.MatchingFields{v1alpha1.ReplicaNodeNameField: o.GetName()}); err != nil {
		log.FromContext(ctx).Error(err, "Listing the replicas on a node", "MacNode", klog.KObj(o))
		return nil
	}
	seen := map[reconcile.Request]bool{}
	var reqs []reconcile.Request
	for i := range list.Items {
		for _, req := range deploymentOf(&list.Items[i]) {
			if !seen[req] {
				seen[req] = true
				reqs = append(reqs, req)
			}
		}
	}
	return reqs
}

// replicaPredicate passes replica events that can change an endpoint: creation,
// deletion, and updates of readiness, binding, deletion or ownership (not the
// agent's progress and memory reports).
func replicaPredicate() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		a, b := e.ObjectOld.(*v1alpha1.ModelReplica), e.ObjectNew.(*v1alpha1.ModelReplica)
		return a.Spec.NodeName != b.Spec.NodeName ||
			meta.IsStatusConditionTrue(a.Status.Conditions, v1alpha1.ReplicaReady) != meta.IsStatusConditionTrue(b.Status.Conditions, v1alpha1.ReplicaReady) ||
			(a.DeletionTimestamp == nil) != (b.DeletionTimestamp == nil) ||
			(a.Spec.Drain == nil) != (b.Spec.Drain == nil) ||
			a.Labels[v1alpha1.LabelDeployment] != b.Labels[v1alpha1.LabelDeployment] ||
			!equality.Semantic.DeepEqual(metav1.GetControllerOf(a), metav1.GetControllerOf(b))
	}}
}

// nodePredicate passes MacNode events that can change an endpoint: creation,
// deletion, and updates of readiness or agent address (not memory reports).
func nodePredicate() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		a, b := e.ObjectOld.(*v1alpha1.MacNode), e.ObjectNew.(*v1alpha1.MacNode)
		return a.Status.Agent.Address != b.Status.Agent.Address ||
			meta.IsStatusConditionTrue(a.Status.Conditions, v1alpha1.MacNodeReady) != meta.IsStatusConditionTrue(b.Status.Conditions, v1alpha1.MacNodeReady)
	}}
}

// Reconcile makes a deployment's Service and EndpointSlices match its replicas and
// their Macs, writing only what differs.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	logger := log.FromContext(ctx)
	var dep v1alpha1.ModelDeployment
	if err := r.Client.Get(ctx, req.NamespacedName, &dep); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if dep.DeletionTimestamp != nil {
		return ctrl.Result{}, nil // the garbage collector removes what it owns
	}
	if owned, err := r.applyService(ctx, &dep); err != nil || !owned {
		return ctrl.Result{}, err
	}

	var replicas v1alpha1.ModelReplicaList
	if err := r.Client.List(ctx, &replicas, client.InNamespace(dep.Namespace), client.MatchingLabels{v1alpha1.LabelDeployment: dep.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the replicas of %s: %w", klog.KObj(&dep), err)
	}
	nodes := map[string]*v1alpha1.MacNode{}
	for _, mr := range replicas.Items {
		if name := mr.Spec.NodeName; name != "" && nodes[name] == nil {
			var n v1alpha1.MacNode
			switch err := r.Client.Get(ctx, types.NamespacedName{Name: name}, &n); {
			case err == nil:
				nodes[name] = &n
			case !apierrors.IsNotFound(err):
				return ctrl.Result{}, fmt.Errorf("getting MacNode %s: %w", name, err)
			}
		}
	}
	excluded, err := r.addressExclusions(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	recheck := r.verifyAddresses(ctx, &dep, replicas.Items, nodes, excluded)
	desired, skipped := desiredSlices(&dep, replicas.Items, nodes, excluded)
	if len(skipped) > 0 {
		logger.V(1).Info("Replicas left out of the EndpointSlices", "ModelDeployment", klog.KObj(&dep), "skipped", skipped)
	}
	return ctrl.Result{RequeueAfter: recheck}, r.applySlices(ctx, &dep, desired)
}

// verifyAddresses proves the agent address of each Mac holding a Ready replica of
// dep whose address is not excluded already, adding the Macs whose address is not
// proven to excluded (with why), and emitting an AddressUnverified Event on the
// MacNode after each failed handshake. It returns when to look again: the earliest
// expiry of a proof or end of a backoff (0: none).
func (r *Reconciler) verifyAddresses(ctx context.Context, dep *v1alpha1.ModelDeployment, replicas []v1alpha1.ModelReplica,
	nodes map[string]*v1alpha1.MacNode, excluded map[string]string) time.Duration {
	var recheck time.Duration
	done := map[string]bool{}
	for i := range replicas {
		mr := &replicas[i]
		node := nodes[mr.Spec.NodeName]
		if node == nil || done[node.Name] || excluded[node.Name] != "" ||
			!metav1.IsControlledBy(mr, dep) || !meta.IsStatusConditionTrue(mr.Status.Conditions, v1alpha1.ReplicaReady) {
			continue
		}
		done[node.Name] = true
		addr := node.Status.Agent.Address
		if _, _, _, err := parseAgentAddress(addr); err != nil {
			continue // desiredSlices says why
		}
		var readySince time.Time
		if c := meta.FindStatusCondition(node.Status.Conditions, v1alpha1.MacNodeReady); c != nil && c.Status == metav1.ConditionTrue {
			readySince = c.LastTransitionTime.Time
		}
		v, probed := r.Addresses.Verify(ctx, node.Name, addr, readySince)
		if !v.Proven {
			excluded[node.Name] = v.Why
			if probed {
				r.Recorder.Eventf(node, nil, corev1.EventTypeWarning, EventAddressUnverified, "VerifyAddress",
					"%s; it is in no tenant's EndpointSlice until the agent serves its fleet certificate (macfleet://node/%s) at its advertised address (agent --advertise-address)",
					v.Why, node.Name)
			}
		}
		if v.RecheckAfter > 0 && (recheck == 0 || v.RecheckAfter < recheck) {
			recheck = v.RecheckAfter
		}
	}
	return recheck
}

// applyService creates or corrects the deployment's Service. It reports false,
// with an Event, when a Service of that name belongs to something else.
func (r *Reconciler) applyService(ctx context.Context, dep *v1alpha1.ModelDeployment) (bool, error) {
	want := desiredService(dep)
	var svc corev1.Service
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), &svc)
	switch {
	case apierrors.IsNotFound(err):
		err = r.Client.Create(ctx, want)
		if apierrors.IsAlreadyExists(err) { // there, but not in the cache: not ours
			r.conflict(dep, want.Name)
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("creating Service %s: %w", klog.KObj(want), err)
		}
		log.FromContext(ctx).Info("Created Service", "Service", klog.KObj(want))
		return true, nil
	case err != nil:
		return false, fmt.Errorf("getting Service %s: %w", klog.KObj(want), err)
	case !metav1.IsControlledBy(&svc, dep):
		r.conflict(dep, want.Name)
		return false, nil
	}
	before := svc.DeepCopy()
	if svc.Labels == nil {
		svc.Labels = map[string]string{}
	}
	maps.Copy(svc.Labels, want.Labels)
	svc.Spec.Type, svc.Spec.Ports, svc.Spec.Selector = want.Spec.Type, want.Spec.Ports, nil
	if equality.Semantic.DeepEqual(before, &svc) {
		return true, nil
	}
	if err := r.Client.Patch(ctx, &svc, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return false, fmt.Errorf("updating Service %s: %w", klog.KObj(&svc), err)
	}
	log.FromContext(ctx).Info("Updated Service", "Service", klog.KObj(&svc))
	return true, nil
}

func (r *Reconciler) conflict(dep *v1alpha1.ModelDeployment, svc string) {
	r.Recorder.Eventf(dep, nil, corev1.EventTypeWarning, EventServiceConflict, "PublishEndpoints",
		"Service %s/%s exists and is not controlled by this deployment; not publishing endpoints", dep.Namespace, svc)
}

// applySlices creates and updates the desired slices, then deletes the deployment's
// other slices, so that an endpoint moving between slices is never missing.
func (r *Reconciler) applySlices(ctx context.Context, dep *v1alpha1.ModelDeployment, desired []discoveryv1.EndpointSlice) error {
	logger := log.FromContext(ctx)
	var list discoveryv1.EndpointSliceList
	if err := r.Client.List(ctx, &list, client.InNamespace(dep.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: ServiceName(dep.Name), discoveryv1.LabelManagedBy: ManagedBy}); err != nil {
		return fmt.Errorf("listing the EndpointSlices of %s: %w", klog.KObj(dep), err)
	}
	existing := map[string]*discoveryv1.EndpointSlice{}
	for i := range list.Items {
		if metav1.IsControlledBy(&list.Items[i], dep) {
			existing[list.Items[i].Name] = &list.Items[i]
		}
	}
	for i := range desired {
		want := &desired[i]
		cur, ok := existing[want.Name]
		delete(existing, want.Name)
		switch {
		case !ok:
			if err := r.Client.Create(ctx, want); err != nil {
				return fmt.Errorf("creating EndpointSlice %s: %w", klog.KObj(want), err)
			}
			logger.V(1).Info("Created EndpointSlice", "EndpointSlice", klog.KObj(want), "endpoints", len(want.Endpoints))
		case cur.AddressType != want.AddressType: // immutable; the name encodes it, so only if edited by hand
			if err := r.Client.Delete(ctx, cur, client.Preconditions{UID: &cur.UID}); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("replacing EndpointSlice %s: %w", klog.KObj(cur), err)
			}
			if err := r.Client.Create(ctx, want); err != nil {
				return fmt.Errorf("replacing EndpointSlice %s: %w", klog.KObj(want), err)
			}
		case sliceDiffers(cur, want):
			if cur.Labels == nil {
				cur.Labels = map[string]string{}
			}
			maps.Copy(cur.Labels, want.Labels)
			cur.Endpoints, cur.Ports = want.Endpoints, want.Ports
			if err := r.Client.Update(ctx, cur); err != nil {
				return fmt.Errorf("updating EndpointSlice %s: %w", klog.KObj(cur), err)
			}
			logger.V(1).Info("Updated EndpointSlice", "EndpointSlice", klog.KObj(cur), "endpoints", len(want.Endpoints))
		}
	}
	for _, stale := range existing {
		if err := r.Client.Delete(ctx, stale, client.Preconditions{UID: &stale.UID}); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting EndpointSlice %s: %w", klog.KObj(stale), err)
		}
		logger.V(1).Info("Deleted EndpointSlice", "EndpointSlice", klog.KObj(stale))
	}
	return nil
}

// sliceDiffers says whether cur lacks a label of want or has other endpoints or
// ports.
func sliceDiffers(cur, want *discoveryv1.EndpointSlice) bool {
	for k, v := range want.Labels {
		if cur.Labels[k] != v {
			return true
		}
	}
	return !equality.Semantic.DeepEqual(cur.Endpoints, want.Endpoints) || !equality.Semantic.DeepEqual(cur.Ports, want.Ports)
}

// addressExclusions reads every MacNode (cache) and the API server's addresses and
// says which Macs' agent addresses are not their own (see addressExclusions).
func (r *Reconciler) addressExclusions(ctx context.Context) (map[string]string, error) {
	var all v1alpha1.MacNodeList
	if err := r.Client.List(ctx, &all); err != nil {
		return nil, fmt.Errorf("listing MacNodes: %w", err)
	}
	reserved, err := r.reserved.get(ctx, r.APIReader, time.Now())
	if err != nil {
		return nil, err
	}
	return addressExclusions(all.Items, reserved), nil
}
