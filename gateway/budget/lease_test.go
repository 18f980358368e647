package budget

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

// TestAdmission: with no other live replica a request is decided as by Decide (no
// lease); with one, it is admitted only within this replica's lease on each window
// of each budget that applies, and otherwise asks for the lease it needs: its usage
// and reservations there with its ask (Min), plus a chunk (Want).
func TestAdmission(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 11, 25, 10, 30, 15, 0, time.UTC))
	now := clk.Now()
	minute, hour := Start(Minute, now), Start(Hour, now)
	perMin := []mfv1.TokenBudget{tb("b", "", ptr.To[int64](200), nil, nil, nil)}
	live, stale := map[string]time.Time{"gw-b": now.Add(-StaleAfter)}, map[string]time.Time{"gw-b": now.Add(-StaleAfter - time.Millisecond)}
	mine := func(used, reserved int64) Own {
		t := Tally{Minute: minute, MinuteTokens: used, Reserved: reserved, InFlight: 1}
		return Own{Key: t, Namespace: t}
	}
	lease := func(gw string, w Window, start time.Time, tokens int64) Lease {
		return Lease{Gateway: gw, Window: w, Start: start, Tokens: tokens, Renewed: now}
	}
	for _, tc := range []struct {
		name     string
		budgets  []mfv1.TokenBudget
		own      Own
		gateways map[string]time.Time
		leases   []Lease
		ask      int64
		// req, when set, is the request instead of a fixed ask.
		req  *Request
		want Plan
	}{
		{name: "alone: admitted with no lease", budgets: perMin, own: mine(10, 0), ask: 187,
			want: Plan{Decision: Decision{Allowed: true}}},
		{name: "the other replica went stale: alone again", budgets: perMin, own: mine(10, 0), gateways: stale, ask: 187,
			want: Plan{Decision: Decision{Allowed: true}}},
		{name: "another live, no lease: lease the ask at least", budgets: perMin, gateways: live, ask: 187,
			want: Plan{Needs: []Need{{Budget: "team-a/b", Key: "ci", Window: Minute, Start: minute, Min: 187, Want: 187}}}},
		{name: "a small ask leases a quarter of its share", budgets: perMin, own: mine(10, 5), gateways: live, ask: 3,
			want: Plan{Needs: []Need{{Budget: "team-a/b", Key: "ci", Window: Minute, Start: minute, Min: 18, Want: 15 + 25}}}},
		{name: "within its lease: admitted", budgets: perMin, own: mine(10, 5), gateways: live, ask: 25,
			leases: []Lease{lease("gw-a", Minute, minute, 40)}, want: Plan{Decision: Decision{Allowed: true}}},
		{name: "last minute's lease does not count", budgets: perMin, own: mine(10, 5), gateways: live, ask: 25,
			leases: []Lease{lease("gw-a", Minute, minute.Add(-time.Minute), 200)},
			want:   Plan{Needs: []Need{{Budget: "team-a/b", Key: "ci", Window: Minute, Start: minute, Min: 40, Want: 15 + 25}}}},
		{name: "another replica's lease is not this one's", budgets: perMin, gateways: live, ask: 25,
			leases: []Lease{lease("gw-b", Minute, minute, 200)},
			want:   Plan{Needs: []Need{{Budget: "team-a/b", Key: "ci", Window: Minute, Start: minute, Min: 25, Want: 25}}}},
		{name: "an ask over the limit needs the whole limit", budgets: perMin, gateways: live, ask: 500,
			want: Plan{Needs: []Need{{Budget: "team-a/b", Key: "ci", Window: Minute, Start: minute, Min: 200, Want: 500}}}},
		{name: "each window of each budget that applies", gateways: live, ask: 10,
			budgets: []mfv1.TokenBudget{tb("ns", "", nil, ptr.To[int64](8000), nil, nil), tb("key", "ci", ptr.To[int64](80), nil, nil, nil),
				tb("other", "batch", ptr.To[int64](1), nil, nil, nil)},
			leases: []Lease{lease("gw-a", Hour, hour, 5)},
			want: Plan{Needs: []Need{{Budget: "team-a/ns", Key: "ci", Window: Hour, Start: hour, Min: 10, Want: 1000},
				{Budget: "team-a/key", Key: "ci", Window: Minute, Start: minute, Min: 10, Want: 10}}}},
		{name: "capped to the room left alone", budgets: perMin, own: mine(10, 40), req: &Request{Prompt: 30, Choices: 4, Output: 1536},
			want: Plan{Decision: Decision{Allowed: true, Cap: 30, Ask: 150}}},
		{name: "capped, another live: lease what it was capped to", budgets: perMin, own: mine(10, 40), gateways: live,
			req:  &Request{Prompt: 30, Choices: 4, Output: 1536},
			want: Plan{Needs: []Need{{Budget: "team-a/b", Key: "ci", Window: Minute, Start: minute, Min: 200, Want: 200}}}},
		{name: "capped within its lease: admitted capped", budgets: perMin, own: mine(10, 40), gateways: live,
			req: &Request{Prompt: 30, Choices: 4, Output: 1536}, leases: []Lease{lease("gw-a", Minute, minute, 200)},
			want: Plan{Decision: Decision{Allowed: true, Cap: 30, Ask: 150}}},
		{name: "refused before any lease", budgets: perMin, own: mine(195, 0), gateways: live, ask: 10,
			want: Plan{Decision: Decision{Budget: "team-a/b", Window: Minute, Limit: 200, Used: 195, Ask: 10, Reset: minute.Add(time.Minute)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Snapshot{Self: "gw-a", Budgets: tc.budgets, Own: tc.own, Gateways: tc.gateways,
				Leases: func(b *mfv1.TokenBudget) []Lease {
					if b.Name == "ns" || b.Name == "b" {
						return tc.leases
					}
					return nil
				}}
			req := Request{Prompt: tc.ask}
			if tc.req != nil {
				req = *tc.req
			}
			if diff := cmp.Diff(tc.want, Admission(s, "ci", req, clk.Now())); diff != "" {
				t.Errorf("Admission (-want +got):\n%s", diff)
			}
		})
	}
}

// TestGrant: the lease a replica may take is what the others' live leases, and the
// usage of replicas without one, leave of the limit, up to its Want; under its Min
// it is refused until the window resets.
func TestGrant(t *testing.T) {
	now := time.Date(2026, 11, 25, 10, 30, 15, 0, time.UTC)
	minute := Start(Minute, now)
	mt, mmt := metav1.NewTime, metav1.NewMicroTime
	tl := func(gw string, start time.Time, tokens int64, renewed time.Time) mfv1.TokenLease {
		return mfv1.TokenLease{Gateway: gw, Window: mfv1.LeaseMinute, Start: mt(start), Tokens: tokens, RenewTime: mmt(renewed)}
	}
	budget := func(ls ...mfv1.TokenLease) *mfv1.TokenBudget {
		b := tb("b", "", ptr.To[int64](200), nil, nil, nil)
		b.Status.Leases = ls
		return &b
	}
	need := Need{Budget: "team-a/b", Key: "ci", Window: Minute, Start: minute, Min: 187, Want: 187}
	usage := func(gw string, used, reserved int64, renewed time.Time) Peer {
		t := Tally{Minute: minute, MinuteTokens: used, Reserved: reserved}
		return Peer{Gateway: gw, Renewed: renewed, Total: t, Keys: map[string]Tally{"ci": t}}
	}
	alive := map[string]time.Time{"gw-b": now}
	refused := func(used int64) Decision {
		return Decision{Budget: "team-a/b", Window: Minute, Limit: 200, Used: used, Leased: true, Ask: 187,
			Reset: minute.Add(time.Minute)}
	}
	for _, tc := range []struct {
		name     string
		b        *mfv1.TokenBudget
		need     Need
		peers    []Peer
		gateways map[string]time.Time
		want     []mfv1.TokenLease
		wantD    Decision
	}{
		{name: "an empty window: the whole want", b: budget(), need: need, gateways: alive,
			want: []mfv1.TokenLease{tl("gw-a", minute, 187, now)}, wantD: Decision{Allowed: true}},
		{name: "the other's lease took the room", b: budget(tl("gw-b", minute, 187, now)), need: need, gateways: alive,
			wantD: refused(187)},
		{name: "the other's lease counts while its replica renews, whenever the lease was written",
			b: budget(tl("gw-b", minute, 187, now.Add(-time.Minute))), need: need, gateways: alive, wantD: refused(187)},
		{name: "a stale replica's lease stops counting, its usage does not",
			b: budget(tl("gw-b", minute, 150, now.Add(-StaleAfter-time.Second))), need: Need{Window: Minute, Start: minute, Key: "ci", Min: 10, Want: 100},
			peers: []Peer{usage("gw-b", 40, 30, now.Add(-StaleAfter-time.Second))},
			want:  []mfv1.TokenLease{tl("gw-a", minute, 100, now), tl("gw-b", minute, 150, now.Add(-StaleAfter-time.Second))},
			wantD: Decision{Allowed: true}},
		{name: "a live replica without a lease: its usage and reservations", b: budget(), need: need,
			peers: []Peer{usage("gw-b", 10, 5, now)}, gateways: alive, wantD: refused(15)},
		{name: "a leaseholder that used more than its lease counts what it used", b: budget(tl("gw-b", minute, 10, now)),
			need: Need{Window: Minute, Start: minute, Key: "ci", Min: 10, Want: 100}, peers: []Peer{usage("gw-b", 120, 0, now)},
			gateways: alive, want: []mfv1.TokenLease{tl("gw-a", minute, 80, now), tl("gw-b", minute, 10, now)}, wantD: Decision{Allowed: true}},
		{name: "grows its own lease, never shrinks it; ended windows dropped",
			b:    budget(tl("gw-a", minute, 120, now.Add(-time.Second)), tl("gw-b", minute.Add(-time.Minute), 200, now)),
			need: Need{Window: Minute, Start: minute, Key: "ci", Min: 110, Want: 100}, gateways: alive,
			want: []mfv1.TokenLease{tl("gw-a", minute, 120, now)}, wantD: Decision{Allowed: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, d := Grant(tc.b, "gw-a", tc.need, tc.peers, tc.gateways, now)
			if diff := cmp.Diff(tc.wantD, d); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("leases (-want +got):\n%s", diff)
			}
		})
	}
}

// TestGrantBoundsTheLeases: a status at its bound drops the leases of stale replicas
// to make room for this one's.
func TestGrantBoundsTheLeases(t *testing.T) {
	now := time.Date(2026, 11, 25, 10, 30, 15, 0, time.UTC)
	minute := Start(Minute, now)
	b := tb("b", "", ptr.To[int64](1_000_000), nil, nil, nil)
	for i := range MaxLeases {
		b.Status.Leases = append(b.Status.Leases, mfv1.TokenLease{Gateway: fmt.Sprintf("gw-%d", i), Window: mfv1.LeaseMinute,
			Start: metav1.NewTime(minute), Tokens: 1, RenewTime: metav1.NewMicroTime(now.Add(-time.Hour))})
	}
	got, d := Grant(&b, "gw-z", Need{Window: Minute, Start: minute, Min: 1, Want: 1}, nil, nil, now)
	if !d.Allowed || len(got) != 1 || got[0].Gateway != "gw-z" {
		t.Errorf("Grant at the bound: %v, %d leases (%v), want gw-z's alone", d, len(got), got)
	}
}
