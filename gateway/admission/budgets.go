package admission

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/budget"
	"github.com/macfleet/macfleet/gateway/ledger"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/rebuild"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

// The gateway counts its team callers' usage in TokenUsage records of their
// namespaces (package ledger) and reads the TokenBudgets that limit them.
// +kubebuilder:rbac:groups=macfleet.dev,resources=tokenbudgets,verbs=get;list;watch
// +kubebuilder:rbac:groups=macfleet.dev,resources=tokenbudgets/status,verbs=get;update
// +kubebuilder:rbac:groups=macfleet.dev,resources=tokenusages,verbs=get;list;watch;create;patch;delete

// Budgets enforces the teams' TokenBudgets and keeps this replica's usage ledger: a
// team caller's request is checked against the budgets of its namespace (with the
// replica's own exact counts and what the other replicas last published) before it
// is queued, reserving the most it can use until it ends, and its answer's usage is
// added to the ledger. Admin callers are not
// budgeted. It is a manager Runnable that follows the TokenBudgets and the other
// replicas' TokenUsage records through the informer cache.
type Budgets struct {
	ledger *ledger.Ledger
	clock  clock.PassiveClock
	cache  cache.Cache
	log    logr.Logger
	kick   chan struct{}
	synced atomic.Bool

	// budgets are the TokenBudgets by namespace.
	budgets atomic.Pointer[map[string][]mfv1.TokenBudget]

	// leaser writes this replica's leases; nil when the budgets are set with
	// SetBudgets (tests, benchmarks) and no LeaseWith.
	leaser *leaser

	mu sync.RWMutex
	// peers are the other replicas' records by namespace and name; lists is each
	// namespace's as one slice, rebuilt when one changes; gateways when each other
	// replica last renewed a record of any namespace.
	peers    map[string]map[string]budget.Peer
	lists    map[string][]budget.Peer
	gateways map[string]time.Time
}

// NewBudgets enforces budgets for the replica whose ledger is l. c may be nil when
// the budgets are set with SetBudgets (tests, benchmarks).
func NewBudgets(l *ledger.Ledger, c cache.Cache, clk clock.PassiveClock, log logr.Logger) *Budgets {
	b := &Budgets{ledger: l, clock: clk, cache: c, log: log, kick: make(chan struct{}, 1),
		peers: map[string]map[string]budget.Peer{}, lists: map[string][]budget.Peer{}, gateways: map[string]time.Time{}}
	b.budgets.Store(&map[string][]mfv1.TokenBudget{})
	return b
}

// LeaseWith has the budgets lease room for this replica, self, on the TokenBudgets
// through writer while other replicas are live (before Start).
func (b *Budgets) LeaseWith(self string, writer client.Client) {
	b.leaser = newLeaser(self, writer, b.clock)
}

// Follow has Start read the TokenBudgets and the other replicas' records from c
// (before Start).
func (b *Budgets) Follow(c cache.Cache) { b.cache = c }

// Synced reports whether the budgets were read from synced informers.
func (b *Budgets) Synced() bool { return b.synced.Load() }

// SetBudgets replaces every namespace's budgets with bs. The first namespace with a
// budget (by name, the same on every replica) that is not being deleted carries this
// replica's heartbeat: its record there is renewed every ledger.RenewEvery, so the
// other replicas know it is live and lease (ledger.SetBeat).
func (b *Budgets) SetBudgets(bs []mfv1.TokenBudget) {
	m := map[string][]mfv1.TokenBudget{}
	for _, tb := range bs {
		m[tb.Namespace] = append(m[tb.Namespace], tb)
	}
	b.budgets.Store(&m)
	if b.leaser != nil {
		b.ledger.SetBeat(slices.Sorted(maps.Keys(m))...)
		b.leaser.retain(bs)
	}
}

// Admit checks id's request, which may use up to req (budget.Estimate), against its
// budgets, and reserves it in the ledger when it is admitted, capped to the room
// left: capped is each choice's cap on its output then (0: not capped); a refusal is
// the error to answer. While another replica is live, it first leases the room the
// request needs (budget.Admission, leaser). done ends an admitted request and
// releases its reservation, after its usage was recorded (nil for callers that are
// not counted).
func (b *Budgets) Admit(ctx context.Context, id tenancy.Identity, req budget.Request) (done func(), capped int64, refusal *Refusal) {
	if id.Admin || id.Namespace == "" {
		return nil, 0, nil
	}
	bs := (*b.budgets.Load())[id.Namespace]
	for attempt := 0; ; attempt++ {
		var needs []budget.Need
		d, done := b.ledger.Admit(id.Namespace, id.Name, req.Tokens(), func(own budget.Own) budget.Decision {
			if len(bs) == 0 {
				return budget.Decision{Allowed: true}
			}
			b.mu.RLock()
			defer b.mu.RUnlock()
			s := budget.Snapshot{Self: b.ledger.Gateway(), Budgets: bs, Own: own, Peers: b.lists[id.Namespace]}
			if b.leaser != nil { // without one, this replica counts as the only one
				s.Gateways, s.Leases = b.gateways, b.leaser.leases
			}
			p := budget.Admission(s, id.Name, req, b.clock.Now())
			needs = p.Needs
			return p.Decision
		})
		switch {
		case d.Allowed:
			return done, d.Cap, nil
		case len(needs) == 0:
			return nil, 0, budgetExceeded(d, b.clock.Now())
		case attempt >= leaseAttempts:
			return nil, 0, leaseFailed(fmt.Errorf("the lease did not cover the request after %d writes", attempt))
		}
		b.mu.RLock()
		peers, gateways := b.lists[id.Namespace], maps.Clone(b.gateways)
		b.mu.RUnlock()
		d2, err := b.leaser.acquire(ctx, bs, needs, peers, gateways)
		switch {
		case err != nil:
			b.log.Info("Leasing a budget's room failed", "err", err.Error())
			return nil, 0, leaseFailed(err)
		case d2 != nil && !d2.Allowed:
			return nil, 0, budgetExceeded(*d2, b.clock.Now())
		}
	}
}

// Record adds an answer's usage to id's ledger.
func (b *Budgets) Record(id tenancy.Identity, deployment string, u metering.Usage) {
	if id.Admin || id.Namespace == "" {
		return
	}
	b.ledger.Record(id.Namespace, id.Name, deployment, u)
}

// Refusal is a request the budgets turned away: over a TokenBudget (a 429; Leasing
// false) or because its budget's lease could not be written (a 503 to retry;
// Leasing true). Reason labels the budget admissions metric (budget_exceeded,
// budget_lease); Message says why, and RetryAfter when to try again.
type Refusal struct {
	Reason     string
	Message    string
	RetryAfter time.Duration
	Leasing    bool
}

func (r *Refusal) Error() string { return r.Message }

// budgetExceeded is the refusal of a request over a budget: its message names the
// budget, the window, the limit, what was used and reserved, and the request's ask;
// RetryAfter is the whole seconds until the window resets, or a second when the
// requests in flight hold the room it needs.
func budgetExceeded(d budget.Decision, now time.Time) *Refusal {
	return &Refusal{Reason: "budget_exceeded", Message: d.Message(), RetryAfter: d.RetryAfter(now)}
}

// leaseFailed is the refusal of a request whose budget's lease could not be written.
func leaseFailed(err error) *Refusal {
	return &Refusal{Reason: "budget_lease", Leasing: true, RetryAfter: time.Second,
		Message: "the gateway could not lease room on the caller's TokenBudget from the API server: " + err.Error() +
			": try again"}
}

func (b *Budgets) poke() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// Start follows the TokenBudgets and the TokenUsage records until ctx ends.
func (b *Budgets) Start(ctx context.Context) error {
	tbs, err := b.cache.GetInformer(ctx, &mfv1.TokenBudget{})
	if err != nil {
		return fmt.Errorf("informer for TokenBudgets: %w", err)
	}
	if _, err := tbs.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { b.poke() }, UpdateFunc: func(any, any) { b.poke() }, DeleteFunc: func(any) { b.poke() },
	}); err != nil {
		return fmt.Errorf("watching TokenBudgets: %w", err)
	}
	tus, err := b.cache.GetInformer(ctx, &mfv1.TokenUsage{})
	if err != nil {
		return fmt.Errorf("informer for TokenUsages: %w", err)
	}
	if _, err := tus.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { b.ObserveRecord(obj, false) },
		UpdateFunc: func(_, obj any) { b.ObserveRecord(obj, false) },
		DeleteFunc: func(obj any) { b.ObserveRecord(obj, true) },
	}); err != nil {
		return fmt.Errorf("watching TokenUsages: %w", err)
	}
	if !b.cache.WaitForCacheSync(ctx) {
		return ctx.Err()
	}
	rebuild.Loop(ctx, b.kick, func(ctx context.Context) error {
		var l mfv1.TokenBudgetList
		if err := b.cache.List(ctx, &l); err != nil {
			return fmt.Errorf("listing TokenBudgets: %w", err)
		}
		b.SetBudgets(l.Items)
		b.log.V(1).Info("TokenBudgets read", "budgets", len(l.Items))
		return nil
	}, func(err error) {
		b.log.Error(err, "Reading the TokenBudgets; keeping the previous ones")
	}, &b.synced)
	return nil
}

// ObserveRecord follows another replica's record (a TokenUsage the informer
// reports, or its deletion): kept while it is of today or yesterday (a day's last
// minutes are read while the next begins), dropped when deleted.
func (b *Budgets) ObserveRecord(obj any, deleted bool) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj, deleted = d.Obj, true
	}
	tu, ok := obj.(*mfv1.TokenUsage)
	if !ok || tu.Spec.Gateway == b.ledger.Gateway() {
		return
	}
	keep := !deleted && tu.Spec.Day >= b.clock.Now().UTC().AddDate(0, 0, -1).Format(time.DateOnly)
	var p budget.Peer
	if keep {
		p = budget.PeerFrom(tu)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if keep && p.Renewed.After(b.gateways[p.Gateway]) {
		b.gateways[p.Gateway] = p.Renewed
	}
	ns := b.peers[tu.Namespace]
	if !keep {
		if _, had := ns[tu.Name]; !had {
			return
		}
		delete(ns, tu.Name)
	} else {
		if ns == nil {
			ns = map[string]budget.Peer{}
			b.peers[tu.Namespace] = ns
		}
		ns[tu.Name] = p
	}
	list := make([]budget.Peer, 0, len(ns))
	for _, p := range ns {
		list = append(list, p)
	}
	b.lists[tu.Namespace] = list
}
