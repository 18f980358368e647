// Package modeldeployment is the ModelDeployment controller. It keeps spec.replicas
// ModelReplicas of the deployment's current template, each reserving the memory from
// spec.resources.memory or from an estimate read from the model's GGUF header — once a
// replica of the same model and engine settings has loaded, bounded by the footprint
// it measured (measured.go); rolls
// template changes one surge replica at a time without ever dropping below the
// desired number of ready replicas; and aggregates the replicas' status into the
// deployment's.
package modeldeployment

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/macfleet/macfleet/agent/hubtoken"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// ControllerName names the controller in metrics and logs.
const ControllerName = "modeldeployment"

// Defaults for unset Reconciler fields.
const (
	DefaultEstimateTimeout         = 30 * time.Second
	DefaultEstimateRetryInitial    = 5 * time.Second
	DefaultEstimateRetryMax        = 5 * time.Minute
	DefaultMaxConcurrentReconciles = 4
)

// ReasonReplicaDrained is the reason of the Normal Event on a deployment when one of
// its draining replicas is deleted (drained and unloaded, its Mac lost, or its drain
// timed out).
const ReasonReplicaDrained = "ReplicaDrained"

// Reconciler keeps each ModelDeployment's replicas and status.
type Reconciler struct {
	// Client reads deployments and replicas (the manager's cache) and writes replicas
	// and deployment status. Default: mgr.GetClient().
	Client client.Client
	// Scheme sets the replicas' controller owner references. Default: mgr.GetScheme().
	Scheme *runtime.Scheme
	// Clock stamps condition transitions and times estimate retries.
	// Default: clock.RealClock{}.
	Clock clock.PassiveClock
	// Resolver turns hf:// and ollama:// sources into URLs; its HTTPClient also makes
	// the estimate's first request. Default: &modelsource.Resolver{} (production endpoints).
	Resolver *modelsource.Resolver
	// Estimate reads a GGUF header and estimates its memory. Default: estimate.Estimate.
	Estimate func(context.Context, estimate.Params) (estimate.Result, error)
	// HubToken is the fleet's model hub token, "" when there is none: the estimate of
	// an hf:// source (and of no other) sends it as Authorization, so that the header
	// of a gated or private repository is read as the Macs download it. Default: none.
	HubToken func(context.Context) string
	// HubTokenRetry is when an estimate the hub refused (HubRefusedError) is tried
	// again: the hub token's TTL, within which a Secret created or changed is read.
	// Default: hubtoken.DefaultTTL.
	HubTokenRetry time.Duration
	// EstimateTimeout bounds one estimate (resolve + header read).
	// Default: DefaultEstimateTimeout.
	EstimateTimeout time.Duration
	// EstimateRetryInitial and EstimateRetryMax bound the exponential backoff between
	// attempts to estimate a model that failed. Defaults: DefaultEstimateRetryInitial,
	// DefaultEstimateRetryMax.
	EstimateRetryInitial, EstimateRetryMax time.Duration
	// MaxConcurrentReconciles lets an estimate of one deployment (network bound) not
	// hold up the others. Default: DefaultMaxConcurrentReconciles.
	MaxConcurrentReconciles int
	// DrainTimeout bounds a replica's drain: a replica whose agent has not reported
	// its model unloaded this long after spec.drain was set is deleted anyway.
	// Default: DefaultDrainTimeout.
	DrainTimeout time.Duration
	// Recorder emits a Warning Event on the deployment when its ReplicaFailure
	// condition turns True or changes reason (a replica failing, or waiting for its
	// namespace's FleetQuota), and a Normal one when a draining replica is deleted.
	// Default: mgr.GetEventRecorder(ControllerName).
	Recorder events.EventRecorder

	estimates estimateCache
	expect    expectations
	// policy is the current SourcePolicy, read at the start of every pass; the
	// estimate's connections check their addresses against it.
	policy *sourcepolicy.Holder
}

// +kubebuilder:rbac:groups=macfleet.dev,resources=modeldeployments,verbs=get;list;watch
// +kubebuilder:rbac:groups=macfleet.dev,resources=modeldeployments/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=macfleet.dev,resources=modelreplicas,verbs=get;list;watch;create;delete;patch
// +kubebuilder:rbac:groups=macfleet.dev,resources=sourcepolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=macfleet.dev,resources=macnodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=macfleet.dev,resources=tokenbudgets,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get,resourceNames=macfleet-hub-token,namespace=macfleet-system

// SetupWithManager registers the controller with mgr, filling in unset fields.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return r.setup(mgr, controller.Options{})
}

func (r *Reconciler) setup(mgr ctrl.Manager, opts controller.Options) error {
	if r.Client == nil {
		r.Client = mgr.GetClient()
	}
	if r.Scheme == nil {
		r.Scheme = mgr.GetScheme()
	}
	if r.Clock == nil {
		r.Clock = clock.RealClock{}
	}
	if r.Recorder == nil {
		r.Recorder = mgr.GetEventRecorder(ControllerName)
	}
	if r.Resolver == nil {
		r.Resolver = &modelsource.Resolver{}
	}
	// The estimate connects only where the source policy allows: its client and the
	// parser's dialer check every address they connect to.
	r.policy = sourcepolicy.NewHolder(nil)
	guarded := *r.Resolver
	guarded.HTTPClient = r.policy.Client(guarded.HTTPClient)
	if r.Resolver.HTTPClient == nil {
		guarded.HTTPClient.Timeout = 30 * time.Second
	}
	r.Resolver = &guarded
	if r.Estimate == nil {
		r.Estimate = estimate.Estimate
	}
	if r.HubTokenRetry <= 0 {
		r.HubTokenRetry = hubtoken.DefaultTTL
	}
	if r.EstimateTimeout <= 0 {
		r.EstimateTimeout = DefaultEstimateTimeout
	}
	if r.EstimateRetryInitial <= 0 {
		r.EstimateRetryInitial = DefaultEstimateRetryInitial
	}
	if r.EstimateRetryMax < r.EstimateRetryInitial {
		r.EstimateRetryMax = max(DefaultEstimateRetryMax, r.EstimateRetryInitial)
	}
	if r.DrainTimeout <= 0 {
		r.DrainTimeout = DefaultDrainTimeout
	}
	if r.MaxConcurrentReconciles <= 0 {
		r.MaxConcurrentReconciles = DefaultMaxConcurrentReconciles
	}
	opts.MaxConcurrentReconciles = r.MaxConcurrentReconciles
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		// Spec changes only: the controller's own status patches need no pass.
		For(&v1alpha1.ModelDeployment{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// Every replica change — created, bound, Ready, measured, deleted — wakes its
		// deployment.
		Owns(&v1alpha1.ModelReplica{}).
		// A policy change may allow or deny any deployment's source.
		Watches(&v1alpha1.SourcePolicy{}, handler.EnqueueRequestsFromMapFunc(r.policyChanged)).
		// A Mac that stops being Ready ends the drains of its replicas.
		Watches(&v1alpha1.MacNode{}, handler.EnqueueRequestsFromMapFunc(r.nodeChanged), builder.WithPredicates(nodeReadyChanged())).
		// A budget created or deleted changes which namespaces' in-cluster callers
		// the agents send to the gateway.
		Watches(&v1alpha1.TokenBudget{}, handler.EnqueueRequestsFromMapFunc(r.budgetChanged)).
		WithOptions(opts).
		Complete(r)
}

// Reconcile moves one deployment's replicas toward its spec and reports their state.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	md := &v1alpha1.ModelDeployment{}
	if err := r.Client.Get(ctx, req.NamespacedName, md); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if md.DeletionTimestamp != nil {
		return ctrl.Result{}, nil // the garbage collector deletes the owned replicas
	}
	before := md.DeepCopy()

	replicas, access, err := r.reconcileAccess(ctx, md)
	if err != nil {
		return ctrl.Result{}, err
	}
	in, err := r.observe(ctx, md, replicas, access)
	if err != nil {
		return ctrl.Result{}, err
	}
	drainLeft, syncErr := r.syncReplicas(ctx, md, in)

	now := r.Clock.Now()
	deadline := progressDeadline(md)
	setStatus(md, summarize(in.replicas, in.current), statusInput{
		Desired: desiredReplicas(md), Reservation: in.res.Quantity, EstimateErr: in.res.Err, SourceErr: in.sourceErr, Now: now,
		ProgressDeadline: deadline, Measured: in.measured, FootprintHash: footprintHash(in.tmpl), SplitRefusal: in.res.SplitRefusal,
	})
	if syncErr == nil && in.res.Err == nil && in.sourceErr == nil {
		md.Status.ObservedGeneration = md.Generation
	}
	if err := r.patchStatus(ctx, before, md); err != nil {
		return ctrl.Result{}, errors.Join(syncErr, err)
	}
	if syncErr != nil {
		return ctrl.Result{}, syncErr
	}
	if in.res.Err != nil {
		log.FromContext(ctx).V(2).Info("Memory estimate failed, retrying later", "retryAfter", in.res.RetryAfter, "error", in.res.Err.Error())
		return ctrl.Result{RequeueAfter: in.res.RetryAfter}, nil
	}
	if left, ok := progressLeft(md, deadline, now); ok && left > 0 {
		// Nothing may change before the deadline: look again then.
		drainLeft = minPositive(drainLeft, left)
	}
	// A drain ends by a replica or Mac event, or by its timeout: look again then.
	return ctrl.Result{RequeueAfter: drainLeft}, nil
}

// observed is what one pass read of a deployment's world and decided from it before
// it scales: the replicas, the template and the reservation its new replicas get.
type observed struct {
	replicas []v1alpha1.ModelReplica
	access   replicaAccess
	tmpl     v1alpha1.ModelReplicaTemplate
	hash     string
	// sourceErr says why the policy denies the template's source: then there is no
	// estimate and no new replica.
	sourceErr error
	// measured is what a replica of the same model and engine settings measured.
	measured int64
	res      reservation
	current  func(*v1alpha1.ModelReplica) bool
}

// reconcileAccess lists md's replicas and brings the access each one is given (which
// namespaces' callers go through the gateway) up to date.
func (r *Reconciler) reconcileAccess(ctx context.Context, md *v1alpha1.ModelDeployment) ([]v1alpha1.ModelReplica, replicaAccess, error) {
	replicas, err := r.listReplicas(ctx, md)
	if err != nil {
		return nil, replicaAccess{}, err
	}
	withBudget, err := r.namespacesWithBudget(ctx)
	if err != nil {
		return nil, replicaAccess{}, err
	}
	access := accessFor(md, withBudget)
	if err := r.syncAccess(ctx, access, replicas); err != nil {
		return nil, replicaAccess{}, err
	}
	return replicas, access, nil
}

// observe reads the source policy and the namespace's measurements, and decides md's
// template, whether its source is allowed, and its replicas' reservation.
func (r *Reconciler) observe(ctx context.Context, md *v1alpha1.ModelDeployment, replicas []v1alpha1.ModelReplica, access replicaAccess) (observed, error) {
	policy, err := r.loadPolicy(ctx)
	if err != nil {
		return observed{}, err
	}
	in := observed{replicas: replicas, access: access, tmpl: replicaTemplate(md)}
	in.hash = templateHash(in.tmpl)
	// A source the policy denies gets no estimate and no new replicas.
	in.sourceErr = policy.DecideSource(md.Namespace, in.tmpl.Model.Source).Err(md.Namespace, in.tmpl.Model.Source)
	for _, p := range []string{in.tmpl.Model.Projector, in.tmpl.Model.Draft} {
		if in.sourceErr == nil && p != "" {
			in.sourceErr = policy.DecideSource(md.Namespace, p).Err(md.Namespace, p)
		}
	}
	// What a replica of the same model and engine settings measured — of this
	// deployment or of another in its namespace — or what status kept of it.
	var inNamespace v1alpha1.ModelReplicaList
	if err := r.Client.List(ctx, &inNamespace, client.InNamespace(md.Namespace)); err != nil {
		return observed{}, fmt.Errorf("listing the namespace's replicas: %w", err)
	}
	in.measured, _ = measuredFootprint(in.tmpl, inNamespace.Items, &md.Status)
	if in.sourceErr == nil {
		// The estimate, until a replica of the same footprint measured one.
		in.res = withMeasurement(r.reservationFor(ctx, md, in.tmpl), in.measured)
	}
	in.current = isCurrent(in.hash, in.res)
	return in, nil
}

// syncReplicas scales md's replicas when their reservation is known. An error with a
// reservation is a split deployment's header not read yet: replicas may drain and go,
// none may come.
func (r *Reconciler) syncReplicas(ctx context.Context, md *v1alpha1.ModelDeployment, in observed) (drainLeft time.Duration, err error) {
	res := in.res
	if res.Quantity == nil {
		return 0, nil
	}
	var layers *v1alpha1.LayerMemory
	if res.Layers != nil {
		layers = layerMemoryFor(*res.Layers, res.Quantity.Value(), in.tmpl.Engine.Pipeline())
	}
	spec := replicaSpec{access: in.access, tmpl: in.tmpl, hash: in.hash, q: *res.Quantity, layers: layers}
	return r.sync(ctx, md, spec, res.Err == nil, in.replicas, in.current)
}

// patchStatus patches md's status when it differs from before's, and records an event
// when a failure condition appeared.
func (r *Reconciler) patchStatus(ctx context.Context, before, md *v1alpha1.ModelDeployment) error {
	if equality.Semantic.DeepEqual(before.Status, md.Status) {
		return nil
	}
	// The optimistic lock matters although no one else writes this status: a merge
	// patch only carries the fields that differ from before, so a before from a cache
	// that has not seen this controller's previous patch would leave stale fields.
	// On a conflict the pass is retried on a fresher cache.
	if err := r.Client.Status().Patch(ctx, md, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("patching status: %w", err)
	}
	if reason, note, ok := failureEvent(before.Status.Conditions, md.Status.Conditions); ok {
		r.Recorder.Eventf(md, nil, corev1.EventTypeWarning, reason, "Replicas", "%s", note)
	}
	return nil
}

// minPositive is the smaller of a and b, ignoring zero (none).
func minPositive(a, b time.Duration) time.Duration {
	if a <= 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// loadPolicy reads the SourcePolicy from the cache (the built-in default when there is
// none) and makes it the one the estimate's connections check.
func (r *Reconciler) loadPolicy(ctx context.Context) (*sourcepolicy.Policy, error) {
	sp := &v1alpha1.SourcePolicy{}
	err := r.Client.Get(ctx, client.ObjectKey{Name: v1alpha1.SourcePolicyName}, sp)
	switch {
	case apierrors.IsNotFound(err):
		sp = nil
	case err != nil:
		return nil, fmt.Errorf("reading the source policy: %w", err)
	}
	p, err := sourcepolicy.Compile(sp)
	if err != nil {
		return nil, err
	}
	r.policy.Set(p)
	return p, nil
}

// policyChanged wakes every deployment, forgetting the estimate failures: a source
// the old policy denied may be allowed now.
func (r *Reconciler) policyChanged(ctx context.Context, _ client.Object) []ctrl.Request {
	r.estimates.forgetFailures()
	var list v1alpha1.ModelDeploymentList
	if err := r.Client.List(ctx, &list); err != nil {
		log.FromContext(ctx).Error(err, "Listing deployments after a source policy change")
		return nil
	}
	reqs := make([]ctrl.Request, 0, len(list.Items))
	for _, md := range list.Items {
		reqs = append(reqs, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(&md)})
	}
	return reqs
}

func desiredReplicas(md *v1alpha1.ModelDeployment) int32 {
	if md.Spec.Replicas == nil {
		return 1
	}
	return max(*md.Spec.Replicas, 0)
}

// isCurrent says whether a replica is of the deployment's current template: same
// template hash and, when the reservation is explicit (spec.resources.memory), the
// same reservation, so that changing resources.memory rolls the replicas onto
// reservations the scheduler accounts for. A changed *estimate* does not roll them.
func isCurrent(hash string, res reservation) func(*v1alpha1.ModelReplica) bool {
	return func(mr *v1alpha1.ModelReplica) bool {
		if mr.Spec.TemplateHash != hash {
			return false
		}
		return !res.Explicit || mr.Spec.MemoryReservation.Cmp(*res.Quantity) == 0
	}
}

// listReplicas returns the replicas md controls, from the cache.
func (r *Reconciler) listReplicas(ctx context.Context, md *v1alpha1.ModelDeployment) ([]v1alpha1.ModelReplica, error) {
	var list v1alpha1.ModelReplicaList
	if err := r.Client.List(ctx, &list, client.InNamespace(md.Namespace), client.MatchingLabels(selectorLabels(md))); err != nil {
		return nil, fmt.Errorf("listing replicas: %w", err)
	}
	owned := list.Items[:0]
	for _, mr := range list.Items {
		if metav1.IsControlledBy(&mr, md) {
			owned = append(owned, mr)
		}
	}
	return owned, nil
}

// slowStartBatch calls fn n times, in batches of 1, 2, 4, … run in parallel, and
// stops after the first batch with an error: a scale-up to hundreds of replicas is
// quick, and one that fails (quota, validation) fails after one call, not hundreds.
func slowStartBatch(n int, fn func() error) error {
	for done, batch := 0, 1; done < n; batch *= 2 {
		size := min(batch, n-done)
		errs := make([]error, size)
		var wg sync.WaitGroup
		for i := range size {
			wg.Go(func() { errs[i] = fn() })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		done += size
	}
	return nil
}

// rankPressure sets the Pressure of each bound replica in infos from its MacNode's
// status.memory.pressure (the manager's cache). A Mac that cannot be read ranks as no
// pressure: the order falls back to age, as before pressure was known.
func (r *Reconciler) rankPressure(ctx context.Context, replicas []v1alpha1.ModelReplica, infos []replicaInfo) {
	nodeOf := map[string]string{}
	for i := range replicas {
		nodeOf[replicas[i].Name] = replicas[i].Spec.NodeName
	}
	ranks := map[string]int{}
	for i := range infos {
		node := nodeOf[infos[i].Name]
		if node == "" {
			continue
		}
		rank, ok := ranks[node]
		if !ok {
			mn := &v1alpha1.MacNode{}
			if err := r.Client.Get(ctx, client.ObjectKey{Name: node}, mn); err == nil {
				rank = pressureRank(mn.Status.Memory.Pressure)
			} else if !apierrors.IsNotFound(err) {
				log.FromContext(ctx).V(1).Info("Reading the memory pressure of a Mac failed", "MacNode", node, "error", err.Error())
			}
			ranks[node] = rank
		}
		infos[i].Pressure = rank
	}
}
