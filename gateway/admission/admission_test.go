package admission

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/gateway/fairqueue"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
)

// TestQueueArea: the integral of a queue's length over time, noted at each change.
func TestQueueArea(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 9, 0, 0, 0, time.UTC)
	var q queueArea
	for i, st := range []struct {
		n    int           // the length noted
		at   time.Duration // when, after t0
		want float64       // seconds after the note
	}{
		{n: 3, at: 0, want: 0},                         // the first note starts the count
		{n: 1, at: 2 * time.Second, want: 6},           // 3 for 2 s
		{n: 1, at: 2 * time.Second, want: 6},           // no time passed
		{n: 0, at: 2500 * time.Millisecond, want: 6.5}, // 1 for 0.5 s
		{n: 4, at: 10 * time.Second, want: 6.5},        // empty for 7.5 s
		{n: 4, at: 9 * time.Second, want: 6.5},         // a clock that went back adds nothing
		{n: 0, at: 11 * time.Second, want: 10.5},       // 4 since the mark at 10 s
	} {
		q.note(st.n, t0.Add(st.at))
		if q.seconds != st.want {
			t.Errorf("note %d (%d at +%v): %v request-seconds, want %v", i, st.n, st.at, q.seconds, st.want)
		}
	}
}

// TestClassify: a request's flow is its ServiceAccount's, its key's when the gateway
// takes keys, else its address's; the priority it asks for is capped by its key's,
// and one that names no class is an error.
func TestClassify(t *testing.T) {
	sa := tenancy.Identity{Namespace: "team-a", Name: satoken.NamePrefix + "team-a:bot", Priority: fairqueue.Batch}
	team := tenancy.Identity{Namespace: "team-a", Name: "ci", Priority: fairqueue.Batch}
	for _, tc := range []struct {
		name     string
		id       tenancy.Identity
		keyed    bool
		header   string
		wantFlow string
		wantPrio fairqueue.Priority
		wantErr  bool
	}{
		{name: "address", id: tenancy.Identity{Admin: true}, wantFlow: "addr:10.0.0.9"},
		{name: "address, batch asked", id: tenancy.Identity{Admin: true}, header: "batch", wantFlow: "addr:10.0.0.9", wantPrio: fairqueue.Batch},
		{name: "key, capped by its class", id: team, keyed: true, wantFlow: "key:k1", wantPrio: fairqueue.Batch},
		{name: "ServiceAccount", id: sa, keyed: true, wantFlow: "sa:team-a/" + sa.Name, wantPrio: fairqueue.Batch},
		{name: "unknown class", id: team, keyed: true, header: "urgent", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
			r.RemoteAddr = "10.0.0.9:5555"
			if tc.header != "" {
				r.Header.Set(HeaderPriority, tc.header)
			}
			flow, p, err := Classify(r, tc.id, tc.keyed, "k1")
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), HeaderPriority+" header") {
					t.Fatalf("Classify = %q, %v, %v; want an error naming the header", flow, p, err)
				}
				return
			}
			if err != nil || flow != tc.wantFlow || p != tc.wantPrio {
				t.Errorf("Classify = %q, %v, %v; want %q, %v", flow, p, err, tc.wantFlow, tc.wantPrio)
			}
		})
	}
}
