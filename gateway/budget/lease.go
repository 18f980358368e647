package budget

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/metering"
)

// Leases. A replica's own counts are exact, but the other replicas' reach it only
// when they publish them (every 200 ms, then a watch event): a burst that reaches
// two replicas inside that delay would be admitted by each against the whole limit.
// So while more than one replica is live, a replica admits a budgeted request only
// within the tokens it holds as a lease on each of the budget's windows, written
// into the TokenBudget's status with a conditional update: two replicas can never
// both take the same room. A replica leases a chunk at a time (a quarter of its
// share of the limit, at least the request's ask), so a budget that is large next
// to its requests costs a few writes a window. A lease counts for its window only
// (an unused one returns when the window ends) and while its replica is live. With
// one live replica nothing is leased: its own counts are the whole truth.

// MaxLeases is the most leases a TokenBudget's status holds (its schema's bound).
const MaxLeases = 64

// Lease is one replica's share of one window of a TokenBudget.
type Lease struct {
	Gateway string
	Window  Window
	Start   time.Time
	Tokens  int64
	Renewed time.Time
}

// LeasesFrom reads b's leases.
func LeasesFrom(b *mfv1.TokenBudget) []Lease {
	out := make([]Lease, 0, len(b.Status.Leases))
	for _, l := range b.Status.Leases {
		out = append(out, Lease{Gateway: l.Gateway, Window: Window(l.Window), Start: l.Start.UTC(),
			Tokens: metering.Count(l.Tokens), Renewed: l.RenewTime.Time})
	}
	return out
}

// Snapshot is what a replica knows when it admits a request of a namespace's caller.
type Snapshot struct {
	// Self is this replica.
	Self string
	// Budgets are the namespace's TokenBudgets.
	Budgets []mfv1.TokenBudget
	Own     Own
	// Peers are the other replicas' records of the namespace.
	Peers []Peer
	// Gateways are the other replicas, each with when it last renewed a record of
	// any namespace: those within StaleAfter are live.
	Gateways map[string]time.Time
	// Leases are a budget's leases: this replica's as it wrote them, the others' as
	// last read. Asked only while another replica is live.
	Leases func(*mfv1.TokenBudget) []Lease
}

// Live is how many other replicas are live at now.
func (s Snapshot) Live(now time.Time) int {
	n := 0
	for _, t := range s.Gateways {
		if now.Sub(t) <= StaleAfter {
			n++
		}
	}
	return n
}

// Need is a lease this replica must hold before it admits a request.
type Need struct {
	// Budget is namespace/name; Key the caller's key, whose scope the budget counts.
	Budget, Key string
	Window      Window
	Start       time.Time
	// Min is what the replica's usage and reservations in the window, with the
	// request's ask, take: the least lease that admits it. Want is Min plus room for
	// the next requests (the chunk), what is asked for.
	Min, Want int64
}

// Plan is what to do with a request: admit it (Decision.Allowed), refuse it with
// Decision, or, with Needs, lease first and plan again.
type Plan struct {
	Decision Decision
	Needs    []Need
}

// Admission plans a request of key that may use up to req. It is Fit, and, while
// another replica is live, the leases this replica must hold for it (as capped).
func Admission(s Snapshot, key string, req Request, now time.Time) Plan {
	d := Fit(s.Budgets, key, req, s.Own, s.Peers, now)
	live := s.Live(now)
	if !d.Allowed || live == 0 {
		return Plan{Decision: d}
	}
	ask := max(req.Tokens(), 1)
	if d.Cap > 0 {
		ask = d.Ask
	}
	var needs []Need
	for i := range s.Budgets {
		b := &s.Budgets[i]
		if b.Spec.Key != "" && b.Spec.Key != key {
			continue
		}
		mine := s.Own.Namespace
		if b.Spec.Key != "" {
			mine = s.Own.Key
		}
		name, leases := b.Namespace+"/"+b.Name, s.Leases(b)
		for _, w := range [...]Window{Day, Hour, Minute} {
			limit := limitOf(b, w)
			if limit == nil {
				continue
			}
			start := Start(w, now)
			held := metering.AddCount(mine.tokens(w, start), mine.Reserved)
			need := metering.AddCount(held, min(ask, *limit))
			if need <= leased(leases, s.Self, w, start) {
				continue
			}
			chunk := max(ask, *limit/int64(4*(live+1)))
			needs = append(needs, Need{Budget: name, Key: key, Window: w, Start: start, Min: need,
				Want: metering.AddCount(held, chunk)})
		}
	}
	if len(needs) > 0 {
		return Plan{Needs: needs}
	}
	return Plan{Decision: d}
}

// limitOf is b's limit of window w, nil when it sets none.
func limitOf(b *mfv1.TokenBudget, w Window) *int64 {
	switch w {
	case Minute:
		return b.Spec.TokensPerMinute
	case Hour:
		return b.Spec.TokensPerHour
	case Day:
		return b.Spec.TokensPerDay
	}
	return nil
}

// leased is gw's lease on the window w that starts at start.
func leased(ls []Lease, gw string, w Window, start time.Time) int64 {
	for _, l := range ls {
		if l.Gateway == gw && l.Window == w && l.Start.Equal(start) {
			return l.Tokens
		}
	}
	return 0
}

// Grant is the lease self may take for n on b as just read (its status's leases,
// with self's own as it last wrote them), given the peers' records of the namespace
// and when each replica last renewed one: the room is the limit less, for each other
// replica, its live lease on the window (or what it used and reserved there, when
// more) or, without one, what it used there (and reserved, while it is live), and
// less what self used there. It returns b's new leases, self's grown to min(room,
// n.Want) and those of ended windows dropped; or, when the room is under n.Min, the
// refusal and no leases.
func Grant(b *mfv1.TokenBudget, self string, n Need, peers []Peer, gateways map[string]time.Time, now time.Time) ([]mfv1.TokenLease, Decision) {
	limit := limitOf(b, n.Window)
	if limit == nil { // the budget changed under the request: no lease needed
		return b.Status.Leases, Decision{Allowed: true}
	}
	live := func(gw string, renewed time.Time) bool {
		return now.Sub(renewed) <= StaleAfter || now.Sub(gateways[gw]) <= StaleAfter
	}
	lease := map[string]int64{} // the other replicas' live leases on the window
	for _, l := range LeasesFrom(b) {
		if l.Gateway != self && l.Window == n.Window && l.Start.Equal(n.Start) && live(l.Gateway, l.Renewed) {
			lease[l.Gateway] = l.Tokens
		}
	}
	taken := map[string]int64{} // what each other replica used and holds in the window
	for _, p := range peers {
		t := p.Total
		if b.Spec.Key != "" {
			t = p.Keys[n.Key]
		}
		used := t.tokens(n.Window, n.Start)
		if now.Sub(p.Renewed) <= StaleAfter {
			used = metering.AddCount(used, t.Reserved)
		}
		taken[p.Gateway] = metering.AddCount(taken[p.Gateway], used)
	}
	for gw, l := range lease {
		taken[gw] = max(taken[gw], l)
	}
	var others int64
	for _, t := range taken {
		others = metering.AddCount(others, t)
	}
	room := max(*limit-others, 0)
	if room < n.Min {
		return nil, Decision{Budget: b.Namespace + "/" + b.Name, Window: n.Window, Limit: *limit,
			Used: others, Leased: true, Ask: n.Min, Reset: end(n.Window, n.Start)}
	}
	return withLease(b.Status.Leases, self, n, min(room, n.Want), now), Decision{Allowed: true}
}

// withLease is ls with self's lease on n's window set to tokens (never less than it
// held), the leases of windows that ended dropped and, over MaxLeases, those of
// replicas not renewed within StaleAfter.
func withLease(ls []mfv1.TokenLease, self string, n Need, tokens int64, now time.Time) []mfv1.TokenLease {
	out := make([]mfv1.TokenLease, 0, len(ls)+1)
	for _, l := range ls {
		switch {
		case !l.Start.UTC().Equal(Start(Window(l.Window), now)):
			continue // its window ended
		case l.Gateway == self && Window(l.Window) == n.Window && l.Start.UTC().Equal(n.Start):
			tokens = max(tokens, l.Tokens)
			continue
		}
		out = append(out, l)
	}
	if len(out) >= MaxLeases {
		out = slices.DeleteFunc(out, func(l mfv1.TokenLease) bool {
			return l.Gateway != self && now.Sub(l.RenewTime.Time) > StaleAfter
		})
	}
	out = append(out, mfv1.TokenLease{Gateway: self, Window: mfv1.LeaseWindow(n.Window), Start: metav1.NewTime(n.Start),
		Tokens: tokens, RenewTime: metav1.NewMicroTime(now)})
	slices.SortFunc(out, cmpLease)
	return out
}

func cmpLease(a, b mfv1.TokenLease) int {
	if c := cmp.Compare(a.Gateway, b.Gateway); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Window, b.Window); c != 0 {
		return c
	}
	return a.Start.Compare(b.Start.Time)
}

// leasedMessage is the refusal of a request whose lease could not grow.
func (d Decision) leasedMessage() string {
	return fmt.Sprintf("TokenBudget %s allows %d tokens per %s: the other gateway replicas used or hold %d of them "+
		"and this replica needs %d for its requests with this one: it resets at %s",
		d.Budget, d.Limit, d.Window, d.Used, d.Ask, d.Reset.UTC().Format(time.RFC3339))
}
