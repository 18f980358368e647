package modeldeployment

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

func TestStaleAccess(t *testing.T) {
	access := func(ns ...string) *v1alpha1.Access { return &v1alpha1.Access{Namespaces: ns} }
	rep := func(name string, a *v1alpha1.Access, deleting bool) v1alpha1.ModelReplica {
		mr := v1alpha1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.ModelReplicaSpec{Access: a}}
		if deleting {
			mr.DeletionTimestamp = &metav1.Time{}
		}
		return mr
	}
	for _, tc := range []struct {
		name     string
		md       *v1alpha1.Access
		replicas []v1alpha1.ModelReplica
		want     []string
	}{
		{name: "none anywhere", replicas: []v1alpha1.ModelReplica{rep("a", nil, false)}},
		{name: "empty is none", md: access(), replicas: []v1alpha1.ModelReplica{rep("a", nil, false), rep("b", access(), false)}},
		{name: "granted", md: access("team-a"), replicas: []v1alpha1.ModelReplica{rep("a", nil, false), rep("b", access("team-a"), false)},
			want: []string{"a"}},
		{name: "revoked", replicas: []v1alpha1.ModelReplica{rep("a", access("team-a"), false)}, want: []string{"a"}},
		{name: "changed", md: access("team-a", "team-c"), replicas: []v1alpha1.ModelReplica{rep("a", access("team-a"), false)},
			want: []string{"a"}},
		{name: "being deleted", md: access("*"), replicas: []v1alpha1.ModelReplica{rep("a", nil, true)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := &v1alpha1.ModelDeployment{Spec: v1alpha1.ModelDeploymentSpec{Access: tc.md}}
			var got []string
			for _, mr := range staleAccess(accessFor(md, nil), tc.replicas) {
				got = append(got, mr.Name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("stale (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBudgetedNamespaces: the namespaces that may use a deployment and have a
// TokenBudget, and replicas whose list differs are stale.
func TestBudgetedNamespaces(t *testing.T) {
	budgets := map[string]bool{"team-a": true, "team-b": true, "team-c": true}
	for _, tc := range []struct {
		name      string
		namespace string
		access    []string
		budgets   map[string]bool
		want      []string
	}{
		{name: "no budget anywhere", namespace: "team-a", access: []string{"*"}},
		{name: "its own namespace", namespace: "team-a", budgets: budgets, want: []string{"team-a"}},
		{name: "its own without a budget", namespace: "team-z", budgets: budgets},
		{name: "a namespace marked without", namespace: "team-a", budgets: map[string]bool{"team-a": false}},
		{name: "granted ones with a budget", namespace: "team-z", access: []string{"team-c", "team-y", "team-a"}, budgets: budgets,
			want: []string{"team-a", "team-c"}},
		{name: "own and granted", namespace: "team-b", access: []string{"team-a"}, budgets: budgets, want: []string{"team-a", "team-b"}},
		{name: "every namespace", namespace: "team-z", access: []string{"*"}, budgets: budgets, want: []string{"team-a", "team-b", "team-c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := &v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: tc.namespace}}
			if tc.access != nil {
				md.Spec.Access = &v1alpha1.Access{Namespaces: tc.access}
			}
			got := budgetedNamespaces(md, tc.budgets)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("budgeted (-want +got):\n%s", diff)
			}
			// A replica with the list is current; one without it (or with another) is stale.
			want := accessFor(md, tc.budgets)
			current := v1alpha1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Name: "current"}}
			setAccess(&current.Spec, want)
			other := v1alpha1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Name: "other"}}
			setAccess(&other.Spec, want)
			other.Spec.BudgetedNamespaces = append(other.Spec.BudgetedNamespaces, "team-q")
			var stale []string
			for _, mr := range staleAccess(want, []v1alpha1.ModelReplica{current, other}) {
				stale = append(stale, mr.Name)
			}
			if !slices.Equal(stale, []string{"other"}) {
				t.Errorf("stale %v, want [other]", stale)
			}
		})
	}
}

// TestAccessFollowsTheDeployment: spec.access reaches new replicas and, in place, the
// existing ones, without rolling them (the node agents scope in-cluster callers by it).
func TestAccessFollowsTheDeployment(t *testing.T) {
	f := newFixture(t)
	f.start(&Reconciler{Estimate: noEstimate(t)})
	md := newDeployment("qwen", "https://models.example/qwen.gguf", 2, "6Gi")
	md.Spec.Access = &v1alpha1.Access{Namespaces: []string{"team-a"}}
	f.create(md)
	reps := f.waitReplicas(2)
	var names []string
	for _, mr := range reps {
		names = append(names, mr.Name)
		if mr.Spec.Access == nil || !slices.Equal(mr.Spec.Access.Namespaces, []string{"team-a"}) {
			t.Errorf("new replica %s: access %+v, want [team-a]", mr.Name, mr.Spec.Access)
		}
	}
	waitAccess := func(want []string) {
		t.Helper()
		f.waitInPlace(names, "access", func(mr *v1alpha1.ModelReplica) []string {
			if mr.Spec.Access == nil {
				return nil
			}
			return mr.Spec.Access.Namespaces
		}, want)
	}
	f.update("qwen", func(md *v1alpha1.ModelDeployment) { md.Spec.Access.Namespaces = []string{"team-a", "team-b"} })
	waitAccess([]string{"team-a", "team-b"})
	f.update("qwen", func(md *v1alpha1.ModelDeployment) { md.Spec.Access = nil })
	waitAccess(nil)
}

// waitInPlace waits until the namespace's replicas are still names (none was
// replaced) and field of each is want.
func (f *fixture) waitInPlace(names []string, what string, field func(*v1alpha1.ModelReplica) []string, want []string) {
	f.t.Helper()
	names = slices.Sorted(slices.Values(names))
	f.waitReplicasWhere(func(reps []v1alpha1.ModelReplica) (bool, string) {
		var got []string
		for i := range reps {
			got = append(got, reps[i].Name)
			if v := field(&reps[i]); !slices.Equal(v, want) {
				return false, fmt.Sprintf("%s: %s %v, want %v", reps[i].Name, what, v, want)
			}
		}
		slices.Sort(got)
		return slices.Equal(got, names), fmt.Sprintf("replicas %v, want the same %v (no roll)", got, names)
	})
}

// waitReplicasWhere waits until cond holds for the namespace's replicas.
func (f *fixture) waitReplicasWhere(cond func([]v1alpha1.ModelReplica) (bool, string)) {
	f.t.Helper()
	testenv.Eventually(f.t, wait, poll, func() (bool, string) { return cond(f.replicas()) })
}

// TestBudgetedFollowsTheTokenBudgets: a TokenBudget created in a namespace that may
// use the deployment reaches its replicas' spec.budgetedNamespaces in place, and its
// deletion takes it out, without rolling them.
func TestBudgetedFollowsTheTokenBudgets(t *testing.T) {
	f := newFixture(t)
	f.start(&Reconciler{Estimate: noEstimate(t)})
	md := newDeployment("qwen", "https://models.example/qwen.gguf", 2, "6Gi")
	md.Spec.Access = &v1alpha1.Access{Namespaces: []string{"*"}}
	f.create(md)
	var names []string
	for _, mr := range f.waitReplicas(2) {
		names = append(names, mr.Name)
		if len(mr.Spec.BudgetedNamespaces) != 0 {
			t.Errorf("replica %s: budgeted %v before any budget", mr.Name, mr.Spec.BudgetedNamespaces)
		}
	}
	waitBudgeted := func(want []string) {
		t.Helper()
		f.waitInPlace(names, "budgetedNamespaces", func(mr *v1alpha1.ModelReplica) []string { return mr.Spec.BudgetedNamespaces }, want)
	}
	budget := &v1alpha1.TokenBudget{ObjectMeta: metav1.ObjectMeta{Name: "team", Namespace: f.ns},
		Spec: v1alpha1.TokenBudgetSpec{TokensPerMinute: ptr.To[int64](1000)}}
	if err := f.c.Create(t.Context(), budget); err != nil {
		t.Fatal(err)
	}
	waitBudgeted([]string{f.ns})
	if err := f.c.Delete(t.Context(), budget); err != nil {
		t.Fatal(err)
	}
	waitBudgeted(nil)
}
