package modeldeployment

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/modelsource"
)

func TestReservationBackoffAndCache(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var calls []estimate.Params
	failing := true
	r := &Reconciler{
		Clock:                clk,
		Resolver:             &modelsource.Resolver{HFEndpoint: "http://hub.test"},
		EstimateTimeout:      time.Second,
		EstimateRetryInitial: 5 * time.Second,
		EstimateRetryMax:     30 * time.Second,
		Estimate: func(_ context.Context, p estimate.Params) (estimate.Result, error) {
			calls = append(calls, p)
			if failing {
				return estimate.Result{}, errors.New("boom")
			}
			return estimate.Result{Total: 441591104}, nil
		},
	}
	md := deployment(func(md *v1alpha1.ModelDeployment) {
		md.Spec.Engine = v1alpha1.EngineSpec{Settings: engine.Settings{ContextLength: 8192, Parallel: 2}}
	})
	tmpl := replicaTemplate(md)

	// Failures back off 5s, 10s, 20s, 30s, 30s; in between, the failure is reused.
	for i, wantDelay := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 30 * time.Second, 30 * time.Second} {
		res := r.reservationFor(t.Context(), md, tmpl)
		if res.Err == nil || res.Quantity != nil || res.RetryAfter != wantDelay {
			t.Fatalf("attempt %d: %+v, want an error and retry after %v", i+1, res, wantDelay)
		}
		if !strings.Contains(res.Err.Error(), "estimating the memory of hf://Qwen/Qwen2.5-GGUF/q4.gguf: boom") {
			t.Errorf("error %q", res.Err)
		}
		if len(calls) != i+1 {
			t.Fatalf("attempt %d: %d estimate calls", i+1, len(calls))
		}
		clk.SetTime(clk.Now().Add(wantDelay - time.Second))
		if res := r.reservationFor(t.Context(), md, tmpl); res.Err == nil || res.RetryAfter != time.Second || len(calls) != i+1 {
			t.Fatalf("attempt %d: a reconcile before the retry time re-estimated or forgot the error: %+v, %d calls", i+1, res, len(calls))
		}
		clk.SetTime(clk.Now().Add(time.Second))
	}
	// contextLength is per sequence: the engine holds 8192 tokens for each of 2 sequences.
	want := estimate.Params{URL: "http://hub.test/Qwen/Qwen2.5-GGUF/resolve/main/q4.gguf", ContextLength: 16384, Parallel: 2, KVCacheType: "f16"}
	if diff := cmp.Diff(want, calls[0], cmpopts.IgnoreFields(estimate.Params{}, "HTTPClient", "Dial")); diff != "" {
		t.Errorf("estimate params mismatch (-want +got):\n%s", diff)
	}

	failing = false
	res := r.reservationFor(t.Context(), md, tmpl)
	if res.Err != nil || res.Quantity == nil || res.Quantity.String() != "422Mi" {
		t.Fatalf("after recovery: %+v, want 422Mi (441591104 bytes rounded up to MiB)", res)
	}
	n := len(calls)
	for range 3 {
		if res := r.reservationFor(t.Context(), md, tmpl); res.Quantity.String() != "422Mi" {
			t.Fatalf("cached: %+v", res)
		}
	}
	if len(calls) != n {
		t.Errorf("cached estimate fetched again: %d calls, want %d", len(calls), n)
	}

	// Other engine settings are another estimate.
	md2 := deployment(func(md *v1alpha1.ModelDeployment) {
		md.Spec.Engine = v1alpha1.EngineSpec{Settings: engine.Settings{ContextLength: 16384, Parallel: 2}}
	})
	r.reservationFor(t.Context(), md2, replicaTemplate(md2))
	if len(calls) != n+1 || calls[n].ContextLength != 16384*2 {
		t.Errorf("new context length did not estimate again: %+v", calls[n:])
	}
}

func TestReservationExplicitAndFile(t *testing.T) {
	r := &Reconciler{
		Clock:                clocktesting.NewFakePassiveClock(time.Now()),
		Resolver:             &modelsource.Resolver{},
		EstimateTimeout:      time.Second,
		EstimateRetryInitial: time.Second,
		EstimateRetryMax:     time.Second,
		Estimate: func(context.Context, estimate.Params) (estimate.Result, error) {
			t.Fatal("estimated although the reservation is known or cannot be estimated")
			return estimate.Result{}, nil
		},
	}
	q := resource.MustParse("9Gi")
	md := deployment(func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model.Source = "file:///models/x.gguf"
		md.Spec.Resources = &v1alpha1.ModelResources{Memory: &q}
	})
	res := r.reservationFor(t.Context(), md, replicaTemplate(md))
	if !res.Explicit || res.Quantity.Cmp(q) != 0 || res.Err != nil {
		t.Errorf("explicit: %+v", res)
	}
	md.Spec.Resources = nil
	res = r.reservationFor(t.Context(), md, replicaTemplate(md))
	if !errors.Is(res.Err, ErrFileSourceNeedsMemory) {
		t.Errorf("file:// without memory: %v", res.Err)
	}
}

func TestIsCurrent(t *testing.T) {
	nine, eight := resource.MustParse("9Gi"), resource.MustParse("8Gi")
	mr := replica("a", "h")
	mr.Spec.MemoryReservation = nine
	for _, tc := range []struct {
		name string
		hash string
		res  reservation
		want bool
	}{
		{"same hash, estimate", "h", reservation{Quantity: &eight}, true},
		{"same hash, explicit same", "h", reservation{Quantity: &nine, Explicit: true}, true},
		{"same hash, explicit changed", "h", reservation{Quantity: &eight, Explicit: true}, false},
		{"same hash, unknown", "h", reservation{Err: errors.New("x")}, true},
		{"other hash", "g", reservation{Quantity: &nine}, false},
	} {
		if got := isCurrent(tc.hash, tc.res)(&mr); got != tc.want {
			t.Errorf("%s: isCurrent = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestExpectations(t *testing.T) {
	var e expectations
	now := time.Now()
	uid := types.UID("u")
	if !e.satisfied(uid, now, nil, nil) {
		t.Fatal("no expectations: not satisfied")
	}
	e.expect(uid, now, []string{"new-1", "new-2"}, []string{"old-1"})
	steps := []struct {
		listed, live []string
		want         bool
	}{
		{[]string{"old-1"}, []string{"old-1"}, false},                           // stale cache
		{[]string{"old-1", "new-1"}, []string{"old-1", "new-1"}, false},         // one creation seen
		{[]string{"old-1", "new-1", "new-2"}, []string{"new-1", "new-2"}, true}, // old-1 is being deleted
		{[]string{"new-1"}, []string{"new-1"}, true},                            // forgotten once seen
	}
	for i, s := range steps {
		if got := e.satisfied(uid, now, sets.New(s.listed...), sets.New(s.live...)); got != s.want {
			t.Errorf("step %d: satisfied = %v, want %v", i, got, s.want)
		}
	}
	e.expect(uid, now, []string{"never-seen"}, nil)
	if e.satisfied(uid, now.Add(time.Minute), sets.New[string](), sets.New[string]()) {
		t.Error("satisfied before the timeout")
	}
	if !e.satisfied(uid, now.Add(expectationsTimeout+time.Second), sets.New[string](), sets.New[string]()) {
		t.Error("not satisfied after the timeout")
	}
}

func TestSlowStartBatch(t *testing.T) {
	var calls int
	ch := make(chan struct{}, 100)
	if err := slowStartBatch(10, func() error { ch <- struct{}{}; return nil }); err != nil {
		t.Fatal(err)
	}
	calls = len(ch)
	if calls != 10 {
		t.Errorf("%d calls, want 10", calls)
	}
	ch = make(chan struct{}, 100)
	err := slowStartBatch(100, func() error { ch <- struct{}{}; return errors.New("quota") })
	if err == nil || len(ch) != 1 {
		t.Errorf("failing: %d calls, err %v; want 1 call and an error", len(ch), err)
	}
}
