package gateway

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/fairqueue"
)

// twoSlotGateway is keysGateway with the gated replica's engine at two slots.
func twoSlotGateway(t *testing.T, q fairqueue.Limits) (*testGateway, *gatedReplica) {
	t.Helper()
	g, rep := keysGateway(t, Options{Queue: q})
	g.SetTable(BuildTable([]mfv1.ModelDeployment{deployment("a", "m", "")},
		[]mfv1.ModelReplica{withParallel(replica("a", "r0", "m", "mac", rep.host(), metav1.ConditionTrue), 2)},
		[]mfv1.MacNode{node("mac", metav1.ConditionTrue)}))
	return g, rep
}

// bThenA1 has key-b send one request and get its answer (key-b is now active), then
// key-a send a1 and waits until a1 reaches the replica; it returns a1's answer.
func bThenA1(t *testing.T, g *testGateway, rep *gatedReplica) map[string]<-chan answer {
	t.Helper()
	b1 := send(t, g, "key-b", "b1")
	rep.waitArrived(t, 1)
	rep.gate <- struct{}{}
	wantOK(t, map[string]<-chan answer{"b1": b1})
	chs := map[string]<-chan answer{"a1": send(t, g, "key-a", "a1")}
	rep.waitArrived(t, 2)
	return chs
}

// TestReserveSlot: on a replica with two slots, a client that floods it while another
// client is active holds one slot, not both, so the other client's next request
// reaches the replica at once instead of waiting behind the flood; with the reserve
// off the flood takes both slots and it waits.
func TestReserveSlot(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reserve int
		want    []string // the order requests reach the replica
	}{
		{"reserve one slot", 1, []string{"b1", "a1", "b2"}},
		{"no reserve", -1, []string{"b1", "a1", "a2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, rep := twoSlotGateway(t, fairqueue.Limits{ReserveSlots: tc.reserve, ActiveWindow: time.Minute})
			chs := bThenA1(t, g, rep)
			chs["a2"] = send(t, g, "key-a", "a2")
			if tc.reserve <= 0 {
				rep.waitArrived(t, 3)
			}
			chs["a3"] = send(t, g, "key-a", "a3")
			if tc.reserve > 0 {
				g.waitQueued(t, fairqueue.Interactive, 2) // a2, a3: a1 holds key-a's one slot
			} else {
				g.waitQueued(t, fairqueue.Interactive, 1)
			}
			chs["b2"] = send(t, g, "key-b", "b2")
			g.waitQueued(t, fairqueue.Interactive, 2)
			rep.waitArrived(t, 3)
			if d := cmp.Diff(tc.want, rep.order()); d != "" {
				t.Errorf("order the replica got (-want +got):\n%s", d)
			}
			for range 4 {
				rep.gate <- struct{}{}
			}
			wantOK(t, chs)
		})
	}
}

// TestReserveSlotReturns: once the other client goes quiet (its active window ends),
// the flooding client's waiting request takes the kept slot without any request
// ending to trigger it.
func TestReserveSlotReturns(t *testing.T) {
	g, rep := twoSlotGateway(t, fairqueue.Limits{ActiveWindow: 3 * time.Second})
	chs := bThenA1(t, g, rep)
	chs["a2"] = send(t, g, "key-a", "a2")
	g.waitQueued(t, fairqueue.Interactive, 1) // key-b arrived less than the window ago
	rep.waitArrived(t, 3)                     // and nothing ends: only the window can free it
	g.waitQueued(t, fairqueue.Interactive, 0)
	for range 2 {
		rep.gate <- struct{}{}
	}
	wantOK(t, chs)
}

// TestQueueReportedToAgents: every forwarded request tells the agent how many
// requests for its deployment wait in this gateway's queue, the integral of that
// over time, and which gateway it is, for the autoscaler's load; a client cannot set
// any of them.
func TestQueueReportedToAgents(t *testing.T) {
	g, rep := keysGateway(t, Options{})
	var mu sync.Mutex
	seen := map[string][3]string{} // tag → queued, gateway, queued seconds
	rep.Config.Handler = wrapHeaders(rep.Config.Handler, func(r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("X-Test-Tag")] = [3]string{r.Header.Get(mfv1.HeaderQueued), r.Header.Get(mfv1.HeaderGateway),
			r.Header.Get(mfv1.HeaderQueuedSeconds)}
		mu.Unlock()
	})
	chs := map[string]<-chan answer{"a1": send(t, g, "key-a", "a1", mfv1.HeaderQueued, "99", mfv1.HeaderGateway, "forged",
		mfv1.HeaderQueuedSeconds, "99999")}
	rep.waitArrived(t, 1)
	chs["a2"] = send(t, g, "key-a", "a2")
	chs["b1"] = send(t, g, "key-b", "b1")
	g.waitQueued(t, fairqueue.Interactive, 2)
	for range 3 {
		rep.gate <- struct{}{}
	}
	wantOK(t, chs)
	mu.Lock()
	defer mu.Unlock()
	// a1 went straight through; the next left one behind it in the queue; the last none.
	order := rep.order()
	want := map[string]string{order[0]: "0", order[1]: "1", order[2]: "0"}
	for tag, q := range want {
		if got := seen[tag]; got[0] != q || got[1] != g.id || g.id == "" {
			t.Errorf("%s reached the agent with queued %q from gateway %q; want %q from %q", tag, got[0], got[1], q, g.id)
		}
	}
	// Nothing had waited when the first one left; the two others waited, two at
	// first, then one: the integral grows from each to the next.
	areas := make([]float64, len(order))
	for i, tag := range order {
		a, err := strconv.ParseFloat(seen[tag][2], 64)
		if err != nil || a < 0 {
			t.Fatalf("%s reached the agent with queued seconds %q, want a non-negative number (%v)", tag, seen[tag][2], err)
		}
		areas[i] = a
	}
	if areas[0] != 0 || areas[1] <= 0 || areas[2] <= areas[1] {
		t.Errorf("queued seconds in the order the requests left: %v; want 0, then growing", areas)
	}
}

// wrapHeaders calls see on each request before h.
func wrapHeaders(h http.Handler, see func(*http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		see(r)
		h.ServeHTTP(w, r)
	})
}
