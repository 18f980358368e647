package clustermode

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// SpecBuilder turns a downloaded replica into the pool's spec of its entry.
type SpecBuilder func(ctx context.Context, name, path string, mr *v1alpha1.ModelReplica) (enginepool.ModelSpec, error)

// SyncerOptions configure a Syncer.
type SyncerOptions struct {
	// NodeName is the MacNode whose replicas this agent serves.
	NodeName string
	// Endpoint is the host:port written into every replica's status.endpoint.
	Endpoint string
	// Cache reads the replicas bound to NodeName (an informer with a field selector);
	// Informer is its event source. Live reads the API server directly and Client
	// writes statuses.
	Cache    client.Reader
	Informer toolscache.SharedIndexInformer
	Live     client.Reader
	Client   client.StatusClient

	Pool  *enginepool.Pool
	Store Store
	// BuildSpec defaults to BuildSpec.
	BuildSpec SpecBuilder
	// SplitLinks give the runner of a split replica's head (this Mac is its
	// spec.nodeName) its workers' loopback addresses; nil runs no split head's runner
	// across its workers.
	SplitLinks *SplitLinks
	Clock      clock.WithTicker
	Log        logr.Logger
	// ResyncPeriod re-examines every replica (memory figures, missed events): 30s.
	ResyncPeriod time.Duration
	// ProgressInterval throttles status writes of download progress: 1s.
	ProgressInterval time.Duration
	// FetchBackoffInitial doubles per consecutive download failure up to
	// FetchBackoffMax: 2s and 5m.
	FetchBackoffInitial, FetchBackoffMax time.Duration
	// LoadBackoffInitial doubles per consecutive load the pool refused or failed, up
	// to LoadBackoffMax: 1s and 5m.
	LoadBackoffInitial, LoadBackoffMax time.Duration
	// Recorded names the pool entries whose runners an earlier agent left running
	// (runnerproc.ProcessFactory.RecordedModels): they are loaded at their first
	// registration even when OnDemand, so that their runners are adopted.
	Recorded []string
	// StatusWritten, when set, is called after every successful status write.
	StatusWritten func(types.NamespacedName)
	// Serving is closed once the agent's server can answer requests (its serving
	// certificate is installed); until then no replica is reported Ready (reason
	// AgentNotServing). Nil: the server answers from the start.
	Serving <-chan struct{}
}

// Syncer drives the engine pool from the ModelReplicas bound to this node and
// reports each replica's status: every informer event, pool event and resync puts
// the replica's key on a queue; one worker compares what the API asks for (Desired)
// with what the node has (Observed) and runs the action of the transition table.
// Downloads, loads and unloads run in their own goroutines and requeue the key when
// they end, so the worker never blocks on them.
type Syncer struct {
	opts   SyncerOptions
	log    logr.Logger
	queue  workqueue.TypedRateLimitingInterface[string]
	writer *statusWriter

	// initialDone is closed once every replica present at the first cache sync has
	// settled (see settled).
	initialDone chan struct{}

	mu       sync.Mutex
	replicas map[string]*replica
	// recorded holds the entries of Recorded not registered yet.
	recorded map[string]bool
	wg       sync.WaitGroup
}

// NewSyncer builds a syncer; Run starts it.
func NewSyncer(opts SyncerOptions) (*Syncer, error) {
	if opts.Pool == nil || opts.Store == nil || opts.Cache == nil || opts.Informer == nil || opts.Client == nil {
		return nil, errors.New("cluster: a syncer needs a pool, a store, a cache, its informer and a client")
	}
	if opts.NodeName == "" {
		return nil, errors.New("cluster: a syncer needs the node name")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Live == nil {
		opts.Live = opts.Cache
	}
	if opts.BuildSpec == nil {
		opts.BuildSpec = BuildSpec
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.ResyncPeriod, 30*time.Second)
	def(&opts.ProgressInterval, time.Second)
	def(&opts.FetchBackoffInitial, 2*time.Second)
	def(&opts.FetchBackoffMax, 5*time.Minute)
	def(&opts.LoadBackoffInitial, time.Second)
	def(&opts.LoadBackoffMax, 5*time.Minute)
	s := &Syncer{
		opts: opts,
		log:  opts.Log,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "modelreplicas"}),
		replicas:    map[string]*replica{},
		initialDone: make(chan struct{}),
		recorded:    map[string]bool{},
	}
	for _, n := range opts.Recorded {
		s.recorded[n] = true
	}
	s.writer = newStatusWriter(opts.Cache, opts.Live, opts.Client, opts.Clock, opts.Log)
	s.writer.written = opts.StatusWritten
	return s, nil
}

// Run syncs replicas until ctx ends. The informer must be running (or started by
// the caller's cache); Run waits for it to sync first. The pool is not unloaded when
// Run returns: the pool's own Run does that on shutdown.
func (s *Syncer) Run(ctx context.Context) error {
	reg, err := s.opts.Informer.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    s.enqueueObject,
		UpdateFunc: func(_, obj any) { s.enqueueObject(obj) },
		DeleteFunc: s.enqueueObject,
	})
	if err != nil {
		return fmt.Errorf("watching replicas: %w", err)
	}
	defer func() { _ = s.opts.Informer.RemoveEventHandler(reg) }()
	s.opts.Pool.AddObserver(s)
	s.writer.start(ctx)

	if !toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		s.shutdown()
		return ctx.Err()
	}
	s.log.Info("Watching the replicas bound to this node", "node", s.opts.NodeName)
	initial := s.opts.Informer.GetStore().ListKeys()
	s.wg.Go(func() { s.watchInitial(ctx, initial) })

	s.wg.Go(func() {
		t := s.opts.Clock.NewTicker(s.opts.ResyncPeriod)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C():
				s.resyncAll()
			}
		}
	})
	if !s.serving() {
		s.wg.Go(func() {
			select {
			case <-s.opts.Serving:
				s.resyncAll() // the replicas held back from Ready are Ready now
			case <-ctx.Done():
			}
		})
	}
	s.wg.Go(func() {
		<-ctx.Done()
		s.queue.ShutDown()
	})
	for s.processNext(ctx) {
	}
	s.shutdown()
	return nil
}

// serving: the agent's server answers requests (SyncerOptions.Serving).
func (s *Syncer) serving() bool {
	if s.opts.Serving == nil {
		return true
	}
	select {
	case <-s.opts.Serving:
		return true
	default:
		return false
	}
}

func (s *Syncer) shutdown() {
	s.queue.ShutDown()
	s.mu.Lock()
	for _, r := range s.replicas {
		if r.cancelFetch != nil {
			r.cancelFetch()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.writer.wait()
}

func (s *Syncer) enqueueObject(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		s.queue.Add(d.Key)
		return
	}
	if mr, ok := obj.(*v1alpha1.ModelReplica); ok {
		s.queue.Add(mr.Namespace + "/" + mr.Name)
	}
}

// enqueue puts key on the queue (a pool or download event).
func (s *Syncer) enqueue(key string) { s.queue.Add(key) }

// resyncAll queues every replica in the cache and every local record.
func (s *Syncer) resyncAll() {
	for _, k := range s.opts.Informer.GetStore().ListKeys() {
		s.queue.Add(k)
	}
	s.mu.Lock()
	for k := range s.replicas {
		s.queue.Add(k)
	}
	s.mu.Unlock()
}

func (s *Syncer) processNext(ctx context.Context) bool {
	key, quit := s.queue.Get()
	if quit {
		return false
	}
	defer s.queue.Done(key)
	after, err := s.sync(ctx, key)
	switch {
	case err != nil:
		s.log.Error(err, "Syncing a replica failed", "replica", key)
		s.queue.AddRateLimited(key)
	case after > 0:
		s.queue.Forget(key)
		s.queue.AddAfter(key, after)
	default:
		s.queue.Forget(key)
	}
	return true
}

// sync runs one step of the transition table for key and submits the replica's
// status. It returns when to look again (0: on the next event).
func (s *Syncer) sync(ctx context.Context, key string) (time.Duration, error) {
	ns, name, err := toolscache.SplitMetaNamespaceKey(key)
	if err != nil {
		return 0, nil
	}
	var mr *v1alpha1.ModelReplica
	var obj v1alpha1.ModelReplica
	switch err := s.opts.Cache.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &obj); {
	case err == nil:
		mr = &obj
	case !apierrors.IsNotFound(err):
		return 0, fmt.Errorf("reading replica %s from the cache: %w", key, err)
	}

	snap := s.opts.Pool.Snapshot()
	s.mu.Lock()
	local := s.replicas[key]
	desired := desiredOf(mr, local, s.opts.NodeName)
	observed := observedOf(local, findModel(snap, key))
	action := splitGate(Decide(desired, observed), mr)
	s.log.V(2).Info("Sync", "replica", key, "desired", desired, "observed", observed, "action", action)
	if observed == ObservedLoaded && local.loadErr != nil {
		local.loadErr, local.loadFailures, local.loadRetryAt = nil, 0, time.Time{}
	}
	var sb specResult
	if needsSpec(action) && local != nil && mr != nil && local.phase != phaseRemoving {
		// The GGUF header is read without the lock, which requests take to resolve
		// their replica; the record must be unchanged afterwards.
		path, phase, projector, draft := local.path, local.phase, local.projectorPath, local.draftPath
		s.mu.Unlock()
		sb.spec, sb.err = s.opts.BuildSpec(ctx, key, path, mr)
		sb.spec.ProjectorPath, sb.spec.DraftPath = projector, draft
		if sb.err == nil && mr.Spec.Split != nil && s.opts.SplitLinks != nil {
			var addrs map[string]enginepool.SplitWorker
			addrs, sb.err = s.opts.SplitLinks.Addrs(mr)
			sb.spec = splitHeadSpec(sb.spec, mr, addrs)
		}
		s.mu.Lock()
		if s.replicas[key] != local || local.phase != phase || local.path != path {
			s.mu.Unlock()
			s.enqueue(key) // changed meanwhile: decide again
			return 0, nil
		}
	}
	after, err := s.actLocked(ctx, action, key, mr, local, snap, sb)
	if m := findModel(snap, key); action == ActionNone && observed == ObservedLoadFailed && m != nil {
		// An OnDemand replica whose load failed or whose runner crashed: when the
		// pool's backoff ends its status turns Ready again (the next request loads it).
		if wait := m.RetryAt.Sub(s.opts.Clock.Now()); wait > 0 {
			after = wait
		}
	}
	local = s.replicas[key]
	if local != nil && mr != nil && local.uid == mr.UID {
		local.access = accessOf(mr)
		local.budgeted = slices.Clone(mr.Spec.BudgetedNamespaces)
	}
	view := local.view()
	s.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if local == nil && s.opts.SplitLinks != nil && (mr == nil || desiredOf(mr, nil, s.opts.NodeName) == DesiredAbsent) {
		s.opts.SplitLinks.Close(key) // the replica is gone from this Mac: so are its links
	}

	if mr != nil && desiredOf(mr, local, s.opts.NodeName) != DesiredAbsent {
		owned := ownedStatus(mr, view, findModel(s.opts.Pool.Snapshot(), key), s.opts.Endpoint, s.opts.Clock.Now())
		if !s.serving() {
			notServing(&owned, s.opts.NodeName)
		}
		s.writer.submit(statusUpdate{key: types.NamespacedName{Namespace: ns, Name: name}, uid: mr.UID, owned: owned})
	}
	return after, nil
}

// specResult is the pool spec built for a replica before an action that needs it.
type specResult struct {
	spec enginepool.ModelSpec
	err  error
}

// needsSpec says whether action registers or updates a pool entry.
func needsSpec(a Action) bool {
	return a == ActionRegisterLoad || a == ActionRegister || a == ActionUpdate
}

// actLocked runs action. Long work runs in goroutines that requeue key when done.
func (s *Syncer) actLocked(ctx context.Context, action Action, key string, mr *v1alpha1.ModelReplica,
	local *replica, snap enginepool.Snapshot, sb specResult) (time.Duration, error) {
	now := s.opts.Clock.Now()
	switch action {
	case ActionNone:
		return 0, nil
	case ActionFetch:
		s.startFetchLocked(ctx, key, mr)
		return 0, nil
	case ActionRetryFetch:
		if wait := local.retryAt.Sub(now); wait > 0 {
			return wait, nil
		}
		failures, lastErr, lastReason := local.fetchFailures, local.fetchErr, local.fetchReason
		s.startFetchLocked(ctx, key, mr)
		// The failure stays in status while the retry runs, so that the deployment
		// keeps showing it until an attempt succeeds.
		r := s.replicas[key]
		r.fetchFailures, r.fetchErr, r.fetchReason = failures, lastErr, lastReason
		return 0, nil
	case ActionRegisterLoad, ActionRegister:
		return s.registerLocked(ctx, local, sb, action == ActionRegisterLoad)
	case ActionLoad:
		if wait := local.loadRetryAt.Sub(now); wait > 0 {
			return wait, nil
		}
		s.loadLocked(ctx, local)
		return 0, nil
	case ActionRetryLoad:
		if m := findModel(snap, key); m != nil && m.RetryAt.After(now) {
			return m.RetryAt.Sub(now), nil
		}
		s.loadLocked(ctx, local)
		return 0, nil
	case ActionUpdate:
		return s.updateLocked(local, mr, sb)
	case ActionRemove:
		s.removeLocked(local)
		return 0, nil
	case ActionRetire:
		s.retireLocked(local)
		return 0, nil
	}
	return 0, fmt.Errorf("no action for replica %s (%s)", key, action)
}

// registerLocked adds the downloaded model to the pool, and loads it when load.
func (s *Syncer) registerLocked(ctx context.Context, r *replica, sb specResult, load bool) (time.Duration, error) {
	spec, err := sb.spec, sb.err
	if err != nil {
		// The file is there but unusable: a download failure, retried after a backoff.
		r.phase = phaseDownloadFailed
		r.fetchErr = fmt.Errorf("the stored file is not a usable model: %w", err)
		r.fetchReason = v1alpha1.ReasonDownloadFailed
		r.fetchFailures++
		r.retryAt = s.opts.Clock.Now().Add(backoff(r.fetchFailures, s.opts.FetchBackoffInitial, s.opts.FetchBackoffMax))
		return r.retryAt.Sub(s.opts.Clock.Now()), nil
	}
	if err := s.opts.Pool.Register(spec); err != nil {
		// An entry of that name is still there (an earlier replica of the same name
		// being removed, or an adopted runner): make it ours.
		if uerr := s.opts.Pool.Update(spec); uerr != nil {
			return 0, fmt.Errorf("registering %s in the pool: %w", r.key, errors.Join(err, uerr))
		}
	}
	r.phase, r.spec = phaseRegistered, spec
	s.log.Info("Model registered", "replica", r.key, "residency", spec.Residency, "contextLength", spec.Engine.TotalContext(),
		"parallel", spec.Engine.Parallel, "estimatedBytes", spec.EstimatedBytes)
	if s.recorded[r.key] {
		// An earlier agent left this model's runner: load now to adopt it (an
		// OnDemand one then idles out as usual).
		delete(s.recorded, r.key)
		r.adopting = true
		load = true
	}
	if load {
		s.loadLocked(ctx, r)
	}
	return 0, nil
}

// loadLocked loads r's model in a goroutine, unless one of ours already does.
func (s *Syncer) loadLocked(ctx context.Context, r *replica) {
	if r.loading {
		return
	}
	r.loading = true
	s.wg.Go(func() {
		err := s.opts.Pool.Load(ctx, r.key)
		s.mu.Lock()
		r.loading, r.adopting = false, false
		switch {
		case err == nil:
			r.loadErr, r.loadFailures, r.loadRetryAt = nil, 0, time.Time{}
		case ctx.Err() == nil:
			// A refused load (no memory) leaves the entry unloaded rather than
			// Failed: the agent's own backoff keeps it from retrying at once.
			r.loadErr = err
			r.loadFailures++
			r.loadRetryAt = s.opts.Clock.Now().Add(backoff(r.loadFailures, s.opts.LoadBackoffInitial, s.opts.LoadBackoffMax))
			s.log.Error(err, "Loading the model failed", "replica", r.key, "failures", r.loadFailures, "retryAt", r.loadRetryAt)
		}
		s.mu.Unlock()
		s.enqueue(r.key)
	})
}

// updateLocked applies a new template (or a new replica of the same name) to r. A
// different file starts over; otherwise the pool entry takes the new spec — residency,
// idle timeout at once, engine settings by unloading the engine so that it is loaded
// again with them.
func (s *Syncer) updateLocked(r *replica, mr *v1alpha1.ModelReplica, sb specResult) (time.Duration, error) {
	if r.phase == phaseRemoving {
		return 0, nil // the removal requeues the key when it is done
	}
	if !sameFiles(mr.Spec.Template.Model, r.template.Model) {
		s.removeLocked(r)
		return 0, nil
	}
	spec := sb.spec
	if sb.err != nil {
		s.removeLocked(r)
		return 0, nil
	}
	if err := s.opts.Pool.Update(spec); err != nil {
		return 0, fmt.Errorf("updating %s in the pool: %w", r.key, err)
	}
	s.log.Info("Replica template changed", "replica", r.key, "from", r.hash, "to", mr.Spec.TemplateHash,
		"residency", spec.Residency)
	r.uid, r.hash, r.template, r.spec = mr.UID, mr.Spec.TemplateHash, *mr.Spec.Template.DeepCopy(), spec
	r.deployment = mr.Labels[v1alpha1.LabelDeployment]
	if m := findModel(s.opts.Pool.Snapshot(), r.key); m != nil && m.PendingRestart &&
		(m.State == enginepool.StateReady || m.State == enginepool.StateLoading) {
		// The engine runs with the old settings: unload it; the table loads it again.
		// The pool's unload event requeues the key.
		if _, err := s.opts.Pool.StartUnload(r.key); err != nil {
			return 0, fmt.Errorf("unloading %s to apply its new engine settings: %w", r.key, err)
		}
	}
	return 0, nil
}

// removeLocked cancels r's download, or drains, unloads and removes its pool entry,
// and forgets r once that is done.
func (s *Syncer) removeLocked(r *replica) {
	switch r.phase {
	case phaseRemoving:
		return
	case phaseDownloading, phaseDownloadFailed, phaseDownloaded:
		if r.cancelFetch != nil {
			r.cancelFetch()
		}
		delete(s.replicas, r.key)
		s.log.Info("Replica forgotten", "replica", r.key)
		s.enqueue(r.key)
		return
	}
	done, err := s.opts.Pool.Remove(r.key)
	r.phase = phaseRemoving
	if err != nil {
		var unknown *enginepool.UnknownModelError
		if !errors.As(err, &unknown) {
			s.log.Error(err, "Removing the model from the pool", "replica", r.key)
		}
		delete(s.replicas, r.key)
		s.enqueue(r.key)
		return
	}
	s.log.Info("Unloading and removing the model", "replica", r.key)
	s.wg.Go(func() {
		<-done
		s.mu.Lock()
		if s.replicas[r.key] == r {
			delete(s.replicas, r.key)
		}
		s.mu.Unlock()
		s.log.Info("Model removed", "replica", r.key)
		s.enqueue(r.key)
	})
}

// retireLocked retires r's pool entry for the replica's drain: the pool refuses its
// requests from now on, drains and unloads its engine, and its unload event requeues
// the key so that the status shows the report. Nothing is left to unload when the
// replica is deleted at last (ActionRemove).
func (s *Syncer) retireLocked(r *replica) {
	if r.phase == phaseRemoving {
		return // already on its way out of the pool
	}
	m := findModel(s.opts.Pool.Snapshot(), r.key)
	if m != nil && m.Retired {
		return
	}
	if _, err := s.opts.Pool.Retire(r.key); err != nil {
		s.log.Error(err, "Retiring the model for the replica's drain", "replica", r.key)
		return
	}
	s.log.Info("Draining and unloading the model: the replica is being removed", "replica", r.key)
}

// The syncer observes its pool (enginepool.Observer): it requeues the replica of
// every load and unload, so the replica's status follows.

// LoadFinished requeues the model's replica.
func (s *Syncer) LoadFinished(ev enginepool.LoadEvent) { s.enqueue(ev.Model) }

// Unloaded requeues the model's replica.
func (s *Syncer) Unloaded(model string, _ enginepool.UnloadReport) { s.enqueue(model) }

// PressureChanged does nothing: a replica's status has no pressure level.
func (s *Syncer) PressureChanged(_, _ enginepool.PressureLevel) {}

// inUse names the models this node needs: the source of every replica bound to it
// in the informer's cache, whatever its state, and of every local record (a replica
// being removed), with the files of those records and of every pool entry.
func (s *Syncer) inUse() ([]store.Model, []string) {
	var models []store.Model
	var paths []string
	for _, obj := range s.opts.Informer.GetStore().List() {
		if mr, ok := obj.(*v1alpha1.ModelReplica); ok {
			models = append(models, filesOf(mr.Spec.Template.Model)...)
		}
	}
	s.mu.Lock()
	for _, r := range s.replicas {
		models = append(models, filesOf(r.template.Model)...)
		if r.path != "" {
			paths = append(paths, r.path)
		}
		for _, p := range []string{r.projectorPath, r.draftPath} {
			if p != "" {
				paths = append(paths, p)
			}
		}
	}
	s.mu.Unlock()
	for _, m := range s.opts.Pool.Snapshot().Models {
		paths = append(paths, m.Spec.Path)
		if m.LoadedSpec != nil {
			paths = append(paths, m.LoadedSpec.Path)
		}
	}
	return models, paths
}
