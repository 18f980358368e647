package admission

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/budget"
)

// leaseAttempts is how many conditional writes a lease gets before the request is
// refused: each conflict is another replica's write, read again live.
const leaseAttempts = 4

// leaseTimeout bounds a request's lease writes: an API server that does not answer
// refuses the request (503) rather than holding it.
const leaseTimeout = 5 * time.Second

// leaser writes this replica's leases into TokenBudgets' status (budget.Grant
// decides them). It keeps its own leases as it wrote them, by budget UID: the
// informer cache may not have seen its last write yet, and only it writes them.
type leaser struct {
	self  string
	c     client.Client // writes, and reads live after a conflict
	clock clock.PassiveClock

	// mu serializes this replica's lease writes: a request that waited finds the
	// lease another one grew.
	mu    sync.Mutex
	ownMu sync.RWMutex
	own   map[types.UID][]budget.Lease
	// live is, under mu, each budget as this replica last wrote or read it live: the
	// next request starts from it rather than from the informer's copy, which may
	// not show another replica's lease yet. Without it, every request of a burst
	// refused for that lease paid a failed write and a live read first, and a burst
	// ran into the API client's rate limit (503s).
	live map[types.UID]*mfv1.TokenBudget
}

func newLeaser(self string, c client.Client, clk clock.PassiveClock) *leaser {
	return &leaser{self: self, c: c, clock: clk, own: map[types.UID][]budget.Lease{},
		live: map[types.UID]*mfv1.TokenBudget{}}
}

// leases are b's leases: the other replicas' as b holds them, this one's as it
// wrote them.
func (l *leaser) leases(b *mfv1.TokenBudget) []budget.Lease {
	l.ownMu.RLock()
	own := l.own[b.UID]
	l.ownMu.RUnlock()
	out := make([]budget.Lease, 0, len(b.Status.Leases)+len(own))
	for _, x := range budget.LeasesFrom(b) {
		if x.Gateway != l.self {
			out = append(out, x)
		}
	}
	return append(out, own...)
}

// acquire takes the leases needs ask for, on the budgets (as cached) they name,
// given the peers' records and the replicas' renewals. It returns the refusal when a
// lease cannot grow to its need, or the error of a write that did not go through.
func (l *leaser) acquire(ctx context.Context, bs []mfv1.TokenBudget, needs []budget.Need,
	peers []budget.Peer, gateways map[string]time.Time) (*budget.Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, leaseTimeout)
	defer cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range needs {
		var cached *mfv1.TokenBudget
		for i := range bs {
			if bs[i].Namespace+"/"+bs[i].Name == n.Budget {
				cached = bs[i].DeepCopy()
			}
		}
		if cached == nil {
			continue // deleted since: it limits nothing
		}
		if live := l.live[cached.UID]; live != nil && newer(live, cached) {
			cached = live.DeepCopy()
		}
		d, err := l.grow(ctx, cached, n, peers, gateways)
		if err != nil || !d.Allowed {
			return &d, err
		}
	}
	return nil, nil
}

// grow writes b's status with this replica's lease on n's window grown, unless
// it already covers n.Min; on a conflict it reads b again live and retries.
func (l *leaser) grow(ctx context.Context, b *mfv1.TokenBudget, n budget.Need,
	peers []budget.Peer, gateways map[string]time.Time) (budget.Decision, error) {
	for attempt := 0; ; attempt++ {
		l.overlay(b)
		for _, x := range budget.LeasesFrom(b) {
			if x.Gateway == l.self && x.Window == n.Window && x.Start.Equal(n.Start) && x.Tokens >= n.Min {
				return budget.Decision{Allowed: true}, nil // another request grew it
			}
		}
		leases, d := budget.Grant(b, l.self, n, peers, gateways, l.clock.Now())
		if !d.Allowed {
			return d, nil
		}
		b.Status.Leases = leases
		err := l.c.Status().Update(ctx, b)
		if err == nil {
			l.keep(b)
			l.live[b.UID] = b.DeepCopy()
			return d, nil
		}
		if !apierrors.IsConflict(err) || attempt+1 >= leaseAttempts {
			return d, fmt.Errorf("leasing %d tokens of TokenBudget %s's %s: %w", n.Want, n.Budget, n.Window, err)
		}
		uid := b.UID
		if err := l.c.Get(ctx, client.ObjectKeyFromObject(b), b); err != nil {
			return d, fmt.Errorf("reading TokenBudget %s: %w", n.Budget, err)
		}
		if b.UID != uid {
			l.forget(uid)
			delete(l.live, uid)
		}
		l.live[b.UID] = b.DeepCopy()
	}
}

// newer reports whether a, read live or written by this replica, is at least as
// recent as b, the informer's copy of the same budget: the API server's resource
// versions are etcd revisions, compared as numbers; one that does not parse as one
// counts as older, so the informer's copy is used. A wrong choice costs a conflict
// and a live read, never room: every lease write is conditional.
func newer(a, b *mfv1.TokenBudget) bool {
	ra, errA := strconv.ParseUint(a.ResourceVersion, 10, 64)
	rb, errB := strconv.ParseUint(b.ResourceVersion, 10, 64)
	return errA == nil && errB == nil && ra >= rb
}

// overlay puts this replica's leases, as it wrote them, into b's status.
func (l *leaser) overlay(b *mfv1.TokenBudget) {
	l.ownMu.RLock()
	own := l.own[b.UID]
	l.ownMu.RUnlock()
	out := b.Status.Leases[:0:0]
	for _, x := range b.Status.Leases {
		if x.Gateway != l.self {
			out = append(out, x)
		}
	}
	for _, x := range own {
		out = append(out, mfv1.TokenLease{Gateway: x.Gateway, Window: mfv1.LeaseWindow(x.Window),
			Start: metav1.NewTime(x.Start), Tokens: x.Tokens, RenewTime: metav1.NewMicroTime(x.Renewed)})
	}
	b.Status.Leases = out
}

// keep records this replica's leases of b as written.
func (l *leaser) keep(b *mfv1.TokenBudget) {
	var own []budget.Lease
	for _, x := range budget.LeasesFrom(b) {
		if x.Gateway == l.self {
			own = append(own, x)
		}
	}
	l.ownMu.Lock()
	l.own[b.UID] = own
	l.ownMu.Unlock()
}

// retain drops what this replica remembers of budgets that are no longer read: a
// deleted TokenBudget's leases and last live copy would otherwise stay in memory for
// the replica's life (one entry per budget ever leased on).
func (l *leaser) retain(bs []mfv1.TokenBudget) {
	keep := make(map[types.UID]bool, len(bs))
	for i := range bs {
		keep[bs[i].UID] = true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for uid := range l.live {
		if !keep[uid] {
			delete(l.live, uid)
		}
	}
	l.ownMu.Lock()
	defer l.ownMu.Unlock()
	for uid := range l.own {
		if !keep[uid] {
			delete(l.own, uid)
		}
	}
}

func (l *leaser) forget(uid types.UID) {
	l.ownMu.Lock()
	delete(l.own, uid)
	l.ownMu.Unlock()
}
