package admission

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/budget"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestLeaserConditionalWrite: two replicas that read the same TokenBudget both lease
// 150 of its 200 tokens a minute on the real API server. The first write goes
// through; the second conflicts (the resourceVersion moved), reads the budget again
// and is refused, naming the other replica's lease; then a lease of what is left
// goes through, and the status holds both leases, within the limit.
func TestLeaserConditionalWrite(t *testing.T) {
	e, err := testenv.New(testenv.WithScheme(mfv1.AddToScheme))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Stop() })
	ns := testenv.NewNamespace(t, e.Client)
	tb := &mfv1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team"},
		Spec: mfv1.TokenBudgetSpec{TokensPerMinute: ptr.To[int64](200)}}
	if err := e.Client.Create(t.Context(), tb); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	start := budget.Start(budget.Minute, now)
	live := map[string]time.Time{"gw-a": now, "gw-b": now}
	need := func(n int64) []budget.Need {
		return []budget.Need{{Budget: ns + "/team", Window: budget.Minute, Start: start, Min: n, Want: n}}
	}
	a, b := newLeaser("gw-a", e.Client, clock.RealClock{}), newLeaser("gw-b", e.Client, clock.RealClock{})
	stale := []mfv1.TokenBudget{*tb.DeepCopy()} // what both replicas' caches hold
	if d, err := a.acquire(t.Context(), stale, need(150), nil, live); d != nil || err != nil {
		t.Fatalf("gw-a's lease of 150: %v, %v", d, err)
	}
	d, err := b.acquire(t.Context(), stale, need(150), nil, live)
	if err != nil || d == nil || d.Allowed || d.Used != 150 || !d.Leased {
		t.Fatalf("gw-b's lease of 150 from the same read: %+v, %v; want refused, 150 held by gw-a", d, err)
	}
	if d, err := b.acquire(t.Context(), stale, need(50), nil, live); d != nil || err != nil {
		t.Fatalf("gw-b's lease of the 50 left: %v, %v", d, err)
	}
	var got mfv1.TokenBudget
	if err := e.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "team"}, &got); err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, l := range got.Status.Leases {
		sum += l.Tokens
	}
	if len(got.Status.Leases) != 2 || sum != 200 {
		t.Errorf("the budget's leases %+v, want gw-a's 150 and gw-b's 50", got.Status.Leases)
	}
	if own := b.leases(&got); len(own) != 2 {
		t.Errorf("gw-b's view of the leases %+v, want both", own)
	}

	// The budget is deleted: the next read of the budgets drops what gw-b remembered
	// of it, its own lease and its live copy, and keeps what another budget holds.
	if len(b.own) != 1 || len(b.live) != 1 {
		t.Fatalf("gw-b remembers %d own lease sets and %d live copies, want 1 and 1", len(b.own), len(b.live))
	}
	other := mfv1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "other", UID: "other-uid"}}
	b.own[other.UID], b.live[other.UID] = nil, other.DeepCopy()
	b.retain([]mfv1.TokenBudget{other})
	if _, ok := b.own[got.UID]; ok || len(b.own) != 1 || len(b.live) != 1 || b.live[other.UID] == nil {
		t.Errorf("after the deletion gw-b remembers own %v and live %v, want only the other budget", b.own, b.live)
	}
}

func TestLeaserNewer(t *testing.T) {
	tb := func(rv string) *mfv1.TokenBudget {
		b := &mfv1.TokenBudget{}
		b.ResourceVersion = rv
		return b
	}
	for _, tc := range []struct {
		live, cached string
		want         bool
	}{
		{"12", "9", true},
		{"12", "12", true},
		{"9", "12", false},
		{"100", "99", true}, // numbers, not strings
		{"x", "9", false},   // not a revision: the informer's copy
		{"9", "", false},
	} {
		if got := newer(tb(tc.live), tb(tc.cached)); got != tc.want {
			t.Errorf("newer(%q, %q) = %v, want %v", tc.live, tc.cached, got, tc.want)
		}
	}
}
