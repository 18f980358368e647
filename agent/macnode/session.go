// Package macnode is the node agent's session with the API server: it registers the
// Mac's MacNode (well-known labels, hardware), renews the node's Lease in
// macfleet-node-lease, writes the MacNode status the agent owns (agent address and
// version, the pool's memory account, the Ready and MemoryPressure conditions) and
// surfaces the administrator's spec.memoryCeiling to the agent.
//
// One goroutine runs rounds: at least every LeaseDuration/4 (renew the Lease, read
// the MacNode, restore Ready=True if the macnode controller set it Unknown while the
// Lease had expired), when the pool's memory changed (NotifyChanged) and every
// StatusInterval (refresh the measured usage). While the API server cannot be reached
// it retries with capped backoff, logs the outage once, and resyncs everything when
// the server answers again; the agent keeps serving throughout.
package macnode

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/hardware"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ceiling"
)

// Defaults of Config.
const (
	DefaultLeaseDuration     = 40 * time.Second
	DefaultStatusInterval    = 30 * time.Second
	DefaultMinNotifyInterval = time.Second
	DefaultShutdownTimeout   = 5 * time.Second
	// initialBackoff is the first retry delay after a failed round; it doubles up to
	// Config.MaxBackoff.
	initialBackoff = 250 * time.Millisecond
	// conflictRetries bounds the re-reads after an optimistic-lock conflict in a round.
	conflictRetries = 3
)

// Config configures a Session. Client and NodeName are required.
type Config struct {
	// Client reads and writes the MacNode (get, create, patch, status patch) and the
	// Lease (get, create, update in macfleet-node-lease). Its scheme must hold
	// macfleet.dev/v1alpha1 and coordination.k8s.io/v1. An uncached client: the
	// session reads one object per round.
	Client client.Client
	// NodeName is the MacNode's and the Lease's name.
	NodeName string
	// Hardware is written into status.hardware and decides the well-known labels.
	Hardware hardware.Info
	// Address is where the agent serves (host:port), written into status.agent.address.
	Address string
	// Version is the agent's version, written into status.agent.version.
	Version string
	// Memory is read for status.memory and the MemoryPressure condition on every
	// status write. Nil leaves both out.
	Memory MemorySource
	// Ceiling is the pool whose ceiling the MacNode's spec.memoryCeiling lowers: the
	// first time the session reads the MacNode and whenever it changes, from the
	// session's goroutine and before the memory status is read, it is given the
	// precedence of internal/ceiling (ceiling.Agent) of FlagCeiling and
	// spec.memoryCeiling: the smaller wins. Nil: the ceiling is only recorded
	// (CeilingOverride).
	Ceiling CeilingSetter
	// FlagCeiling is the agent's --memory-ceiling in bytes (0: unset).
	FlagCeiling int64

	// LeaseDuration is the Lease's leaseDurationSeconds; the Lease is renewed every
	// quarter of it. Default 40s. Rounded up to whole seconds in the Lease.
	LeaseDuration time.Duration
	// StatusInterval is the longest the measured usage in status may go unrefreshed.
	// Default 30s.
	StatusInterval time.Duration
	// MinNotifyInterval spaces status writes triggered by NotifyChanged. Default 1s.
	MinNotifyInterval time.Duration
	// RequestTimeout bounds one round's API calls. Default: the renew interval, at
	// least one second.
	RequestTimeout time.Duration
	// MaxBackoff caps the delay between retries while the API server cannot be
	// reached. Default: the renew interval.
	MaxBackoff time.Duration
	// ShutdownTimeout bounds the final Ready=False (AgentStopping) write when Run's
	// context ends. Default 5s.
	ShutdownTimeout time.Duration

	// Clock tells the time of renewals and schedules rounds. Default: the real clock.
	Clock clock.WithTicker
	// Log receives the session's logs.
	Log logr.Logger
}

// Session keeps one node registered and alive. Create it with New and call Run.
type Session struct {
	cfg        Config
	renewEvery time.Duration
	notify     chan struct{}

	mu       sync.Mutex
	override int64
	seenSpec bool

	// afterRound, when set by tests, is called after every round with its error.
	afterRound func(error)

	// State of the Run goroutine.
	lease       *coordinationv1.Lease
	nodeUID     types.UID
	registered  bool
	resync      bool
	dirty       bool
	lastRenew   time.Time
	lastStatus  time.Time // last time status was compared including the usage
	lastWrite   time.Time // last status write triggered by a notification
	failures    int
	retryAt     time.Time
	outageStart time.Time
}

// New checks cfg and fills in its defaults.
func New(cfg Config) (*Session, error) {
	if cfg.Client == nil {
		return nil, errors.New("node session: a client is required")
	}
	if cfg.NodeName == "" {
		return nil, errors.New("node session: a node name is required")
	}
	if cfg.LeaseDuration <= 0 {
		cfg.LeaseDuration = DefaultLeaseDuration
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = DefaultStatusInterval
	}
	if cfg.MinNotifyInterval <= 0 {
		cfg.MinNotifyInterval = DefaultMinNotifyInterval
	}
	renew := cfg.LeaseDuration / 4
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = max(renew, time.Second)
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = renew
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Session{cfg: cfg, renewEvery: renew, notify: make(chan struct{}, 1)}, nil
}

// NotifyChanged asks for a status write with the pool's current memory account, at
// most every MinNotifyInterval; calls in between are coalesced. It never blocks and
// may be called from any goroutine, before or during Run.
func (s *Session) NotifyChanged() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// CeilingOverride is the MacNode's spec.memoryCeiling in bytes as last read (0 when
// unset), and whether the MacNode has been read at all.
func (s *Session) CeilingOverride() (bytes int64, known bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.override, s.seenSpec
}

// RenewInterval is how often the Lease is renewed: LeaseDuration/4.
func (s *Session) RenewInterval() time.Duration { return s.renewEvery }

// Run keeps the node registered and its Lease renewed until ctx ends, then marks the
// node Ready=False (reason AgentStopping) if the API server answers within
// ShutdownTimeout. It returns nil: failures to reach the API server are retried, not
// returned. Run must be called once.
func (s *Session) Run(ctx context.Context) error {
	log := s.cfg.Log.WithValues("MacNode", klog.KRef("", s.cfg.NodeName))
	log.Info("Starting the node session", "leaseDuration", s.cfg.LeaseDuration, "renewEvery", s.renewEvery,
		"address", s.cfg.Address, "version", s.cfg.Version)
	s.resync, s.dirty = true, true
	for {
		if now := s.cfg.Clock.Now(); s.due(now) {
			err := s.round(ctx, now)
			if ctx.Err() != nil {
				break
			}
			s.account(log, now, err)
			if s.afterRound != nil {
				s.afterRound(err)
			}
		}
		if !s.wait(ctx, s.next(s.cfg.Clock.Now())) {
			break
		}
	}
	s.stopping(log)
	return nil
}

// wait blocks for d, a notification or the end of ctx; false when ctx ended.
func (s *Session) wait(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		// Due already (a fake clock's timer would not fire until it is stepped).
		select {
		case <-ctx.Done():
			return false
		case <-s.notify:
			s.dirty = true
		default:
		}
		return true
	}
	t := s.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-s.notify:
		s.dirty = true
	case <-t.C():
	}
	return true
}

// due says whether a round must run at now.
func (s *Session) due(now time.Time) bool {
	if s.failures > 0 {
		return !now.Before(s.retryAt)
	}
	return !now.Before(s.nextAt())
}

// nextAt is when the next round is due while the API server answers.
func (s *Session) nextAt() time.Time {
	if s.resync {
		return time.Time{}
	}
	at := s.lastRenew.Add(s.renewEvery)
	if t := s.lastStatus.Add(s.cfg.StatusInterval); t.Before(at) {
		at = t
	}
	if s.dirty {
		if t := s.lastWrite.Add(s.cfg.MinNotifyInterval); t.Before(at) {
			at = t
		}
	}
	return at
}

// next is how long to wait from now for the next round.
func (s *Session) next(now time.Time) time.Duration {
	at := s.nextAt()
	if s.failures > 0 {
		at = s.retryAt
	}
	return max(at.Sub(now), 0)
}

// account records a round's outcome: the backoff after a failure, logged once per
// outage, and the recovery.
func (s *Session) account(log logr.Logger, now time.Time, err error) {
	if err == nil {
		if s.failures > 0 {
			log.Info("Reached the API server again; node resynced", "outage", now.Sub(s.outageStart).Round(time.Millisecond),
				"failedAttempts", s.failures)
		}
		s.failures = 0
		return
	}
	if s.failures == 0 {
		s.outageStart = now
		log.Error(err, "Cannot update the node in the API server; the agent keeps serving and retries")
	} else {
		log.V(4).Info("Retry failed", "attempt", s.failures+1, "error", err.Error())
	}
	s.failures++
	s.resync = true
	backoff := min(time.Duration(float64(initialBackoff)*math.Pow(2, float64(s.failures-1))), s.cfg.MaxBackoff)
	s.retryAt = now.Add(backoff)
}

// round registers the node if needed, renews the Lease when due and syncs status.
func (s *Session) round(ctx context.Context, now time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	if s.resync {
		s.registered = false
	}
	if !s.registered {
		if err := s.register(ctx); err != nil {
			return err
		}
	}
	if s.resync || !now.Before(s.lastRenew.Add(s.renewEvery)) {
		if err := s.renewLease(ctx, now); err != nil {
			return err
		}
		s.lastRenew = now
	}
	usage := s.resync || s.dirty || !now.Before(s.lastStatus.Add(s.cfg.StatusInterval))
	wasDirty := s.dirty
	if err := s.syncStatus(ctx, now, usage); err != nil {
		return err
	}
	if usage {
		s.lastStatus = now
	}
	if wasDirty {
		s.lastWrite = now
	}
	s.resync, s.dirty = false, false
	return nil
}

// register creates the MacNode if it does not exist and sets the well-known labels,
// touching neither the spec nor any other label.
func (s *Session) register(ctx context.Context) error {
	want := Labels(s.cfg.Hardware)
	var node v1alpha1.MacNode
	err := s.cfg.Client.Get(ctx, client.ObjectKey{Name: s.cfg.NodeName}, &node)
	if apierrors.IsNotFound(err) {
		node = v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: s.cfg.NodeName, Labels: want}}
		err = s.cfg.Client.Create(ctx, &node)
		if err == nil {
			s.cfg.Log.Info("Registered the MacNode", "MacNode", klog.KObj(&node), "labels", want)
			s.nodeUID, s.registered = node.UID, true
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating MacNode %s: %w", s.cfg.NodeName, err)
		}
		err = s.cfg.Client.Get(ctx, client.ObjectKey{Name: s.cfg.NodeName}, &node)
	}
	if err != nil {
		return fmt.Errorf("reading MacNode %s: %w", s.cfg.NodeName, err)
	}
	before := node.DeepCopy()
	changed := false
	for k, v := range want {
		if node.Labels[k] != v {
			if node.Labels == nil {
				node.Labels = map[string]string{}
			}
			node.Labels[k], changed = v, true
		}
	}
	if changed {
		// A merge patch of the labels alone: the spec and other labels stay as set.
		if err := s.cfg.Client.Patch(ctx, &node, client.MergeFrom(before)); err != nil {
			return fmt.Errorf("labelling MacNode %s: %w", s.cfg.NodeName, err)
		}
	}
	s.nodeUID, s.registered = node.UID, true
	return nil
}

// renewLease creates the node's Lease or sets its holder, duration and renewTime.
func (s *Session) renewLease(ctx context.Context, now time.Time) error {
	seconds := int32(math.Ceil(s.cfg.LeaseDuration.Seconds()))
	renew := metav1.NewMicroTime(now)
	var err error
	for range conflictRetries {
		if s.lease == nil {
			var l coordinationv1.Lease
			err = s.cfg.Client.Get(ctx, client.ObjectKey{Namespace: v1alpha1.NodeLeaseNamespace, Name: s.cfg.NodeName}, &l)
			if apierrors.IsNotFound(err) {
				l = coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.NodeLeaseNamespace, Name: s.cfg.NodeName,
						OwnerReferences: s.ownerRefs()},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(s.cfg.NodeName), LeaseDurationSeconds: ptr.To(seconds),
						AcquireTime: &renew, RenewTime: &renew},
				}
				if err = s.cfg.Client.Create(ctx, &l); err == nil {
					s.lease = &l
					return nil
				}
				if apierrors.IsAlreadyExists(err) {
					continue
				}
				return fmt.Errorf("creating Lease %s/%s: %w", v1alpha1.NodeLeaseNamespace, s.cfg.NodeName, err)
			}
			if err != nil {
				return fmt.Errorf("reading Lease %s/%s: %w", v1alpha1.NodeLeaseNamespace, s.cfg.NodeName, err)
			}
			s.lease = &l
		}
		l := s.lease.DeepCopy()
		if ptr.Deref(l.Spec.HolderIdentity, "") != s.cfg.NodeName || l.Spec.AcquireTime == nil {
			l.Spec.AcquireTime = &renew
		}
		l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime = ptr.To(s.cfg.NodeName), ptr.To(seconds), &renew
		if refs := s.ownerRefs(); refs != nil {
			l.OwnerReferences = refs
		}
		err = s.cfg.Client.Update(ctx, l)
		if err == nil {
			s.lease = l
			return nil
		}
		// Changed or deleted behind our back: read it again.
		s.lease = nil
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			break
		}
	}
	return fmt.Errorf("renewing Lease %s/%s: %w", v1alpha1.NodeLeaseNamespace, s.cfg.NodeName, err)
}

// ownerRefs makes the MacNode own its Lease, so that deleting the node deletes the
// Lease (where a garbage collector runs).
func (s *Session) ownerRefs() []metav1.OwnerReference {
	if s.nodeUID == "" {
		return nil
	}
	return []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "MacNode", Name: s.cfg.NodeName, UID: s.nodeUID}}
}

// syncStatus reads the MacNode, surfaces its memory ceiling override, and patches the
// status the agent owns when it differs. Without usage, a change of the measured
// usage alone is not written.
func (s *Session) syncStatus(ctx context.Context, now time.Time, usage bool) error {
	ready := statusInputs{ready: metav1.ConditionTrue, readyReason: v1alpha1.ReasonAgentReady,
		readyMessage: fmt.Sprintf("The agent renews Lease %s/%s every %s and serves at %s",
			v1alpha1.NodeLeaseNamespace, s.cfg.NodeName, s.renewEvery, s.cfg.Address)}
	var err error
	for range conflictRetries {
		var node *v1alpha1.MacNode
		if node, err = s.getNode(ctx); err != nil {
			return err
		}
		s.surfaceSpec(node.Spec)
		err = s.patchStatus(ctx, node, ready, now, usage)
		if !apierrors.IsConflict(err) {
			break
		}
	}
	return err
}

// getNode reads the MacNode, registering it again if someone deleted it.
func (s *Session) getNode(ctx context.Context) (*v1alpha1.MacNode, error) {
	var node v1alpha1.MacNode
	err := s.cfg.Client.Get(ctx, client.ObjectKey{Name: s.cfg.NodeName}, &node)
	if apierrors.IsNotFound(err) {
		s.cfg.Log.Info("The MacNode was deleted; registering it again", "MacNode", klog.KRef("", s.cfg.NodeName))
		if err = s.register(ctx); err != nil {
			return nil, err
		}
		err = s.cfg.Client.Get(ctx, client.ObjectKey{Name: s.cfg.NodeName}, &node)
	}
	if err != nil {
		return nil, fmt.Errorf("reading MacNode %s: %w", s.cfg.NodeName, err)
	}
	return &node, nil
}

// patchStatus writes the agent's part of node's status with an optimistic lock.
func (s *Session) patchStatus(ctx context.Context, node *v1alpha1.MacNode, in statusInputs, now time.Time, usage bool) error {
	before := node.DeepCopy()
	in.hardware, in.version, in.address = s.cfg.Hardware, s.cfg.Version, s.cfg.Address
	if s.cfg.Memory != nil {
		m := s.cfg.Memory.NodeMemory()
		in.memory = &m
	}
	applyStatus(node, in, now)
	if !statusChanged(before.Status, node.Status, usage) {
		return nil
	}
	patch := client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})
	if err := s.cfg.Client.Status().Patch(ctx, node, patch); err != nil {
		return fmt.Errorf("writing the status of MacNode %s: %w", s.cfg.NodeName, err)
	}
	return nil
}

// statusChanged says whether after differs from before; without usage a difference
// in the measured usage (the pool's and the agent's own) alone does not count.
func statusChanged(before, after v1alpha1.MacNodeStatus, usage bool) bool {
	if equality.Semantic.DeepEqual(before, after) {
		return false
	}
	if usage {
		return true
	}
	cmp := *after.DeepCopy()
	cmp.Memory.Used, cmp.Memory.Agent = before.Memory.Used, before.Memory.Agent
	if cmp.Display != nil && before.Display != nil {
		cmp.Display.Used = before.Display.Used
	}
	return !equality.Semantic.DeepEqual(before, cmp)
}

// surfaceSpec records spec.memoryCeiling and tells the agent when it changed.
func (s *Session) surfaceSpec(spec v1alpha1.MacNodeSpec) {
	var bytes int64
	if q := spec.MemoryCeiling; q != nil {
		bytes = q.Value()
	}
	s.mu.Lock()
	changed := !s.seenSpec || s.override != bytes
	s.override, s.seenSpec = bytes, true
	s.mu.Unlock()
	if changed {
		s.cfg.Log.Info("Memory ceiling override", "MacNode", klog.KRef("", s.cfg.NodeName), "bytes", bytes)
		if s.cfg.Ceiling != nil {
			s.cfg.Ceiling.SetConfiguredCeiling(ceiling.Agent(s.cfg.FlagCeiling, bytes))
		}
	}
}

// stopping marks the node Ready=False (AgentStopping) on a clean shutdown, if the
// API server answers in time; the Lease is left to expire.
func (s *Session) stopping(log logr.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	in := statusInputs{ready: metav1.ConditionFalse, readyReason: v1alpha1.ReasonAgentStopping,
		readyMessage: "The agent is shutting down"}
	var err error
	for range conflictRetries {
		var node v1alpha1.MacNode
		if err = s.cfg.Client.Get(ctx, client.ObjectKey{Name: s.cfg.NodeName}, &node); err != nil {
			break
		}
		if err = s.patchStatus(ctx, &node, in, s.cfg.Clock.Now(), true); !apierrors.IsConflict(err) {
			break
		}
	}
	if err != nil {
		log.Info("Could not mark the node as stopping; the Lease will expire", "error", err.Error())
		return
	}
	log.Info("Node session stopped")
}
