package decide

import (
	"testing"
	"time"
)

func TestRouteRequest(t *testing.T) {
	known := func(s State) RouteInput { return RouteInput{Now: at(10), Known: true, State: s} }
	for _, tc := range []struct {
		name string
		in   RouteInput
		want Route
	}{
		{name: "ready: lease", in: known(StateReady), want: Route{Kind: RouteLease}},
		{name: "loading: join the load", in: known(StateLoading), want: Route{Kind: RouteJoin}},
		{name: "absent: load", in: known(StateAbsent), want: Route{Kind: RouteLoad}},
		{name: "unloaded: load", in: known(StateUnloaded), want: Route{Kind: RouteLoad}},
		{name: "draining: refused", in: known(StateDraining), want: Route{Kind: RouteRefuse, Refusal: RefuseDraining}},
		{name: "stopping: refused", in: known(StateStopping), want: Route{Kind: RouteRefuse, Refusal: RefuseDraining}},
		{name: "failed, in backoff: refused with the time left", want: Route{Kind: RouteRefuse, Refusal: RefuseBackoff, Retry: 5 * time.Second},
			in: RouteInput{Now: at(10), Known: true, State: StateFailed, RetryAt: at(15)}},
		{name: "failed, backoff passed: load", want: Route{Kind: RouteLoad},
			in: RouteInput{Now: at(15), Known: true, State: StateFailed, RetryAt: at(15)}},
		{name: "failed, no backoff: load", want: Route{Kind: RouteLoad},
			in: RouteInput{Now: at(10), Known: true, State: StateFailed}},
		{name: "closed before anything else", want: Route{Kind: RouteRefuse, Refusal: RefuseClosed},
			in: RouteInput{Now: at(10), Closed: true, Known: true, State: StateReady}},
		{name: "closed, unknown model: closed", want: Route{Kind: RouteRefuse, Refusal: RefuseClosed},
			in: RouteInput{Now: at(10), Closed: true}},
		{name: "unknown model", in: RouteInput{Now: at(10), State: StateReady}, want: Route{Kind: RouteRefuse, Refusal: RefuseUnknown}},
		{name: "retired, even when ready", want: Route{Kind: RouteRefuse, Refusal: RefuseRetired},
			in: RouteInput{Now: at(10), Known: true, Retired: true, State: StateReady}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RouteRequest(tc.in); got != tc.want {
				t.Fatalf("RouteRequest(%+v) = %+v (%s, %s), want %+v (%s, %s)", tc.in, got, got.Kind, got.Refusal,
					tc.want, tc.want.Kind, tc.want.Refusal)
			}
		})
	}
}

// TestRouteRequestEveryKind checks that every kind is reachable, so a new kind cannot
// go unhandled by the pool's executor unnoticed.
func TestRouteRequestEveryKind(t *testing.T) {
	seen := map[RouteKind]bool{}
	for _, closed := range []bool{false, true} {
		for _, s := range []State{StateAbsent, StateLoading, StateReady, StateDraining, StateStopping, StateUnloaded, StateFailed} {
			seen[RouteRequest(RouteInput{Now: at(0), Closed: closed, Known: true, State: s, RetryAt: at(1)}).Kind] = true
		}
	}
	for _, k := range RouteKinds {
		if !seen[k] {
			t.Errorf("no input routes to %s", k)
		}
	}
	if got := RouteKind(99).String(); got != "RouteKind(99)" {
		t.Errorf("RouteKind(99).String() = %q", got)
	}
}
