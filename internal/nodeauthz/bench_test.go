package nodeauthz_test

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/nodeauthz"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// BenchmarkDecide is the webhook's decision alone, for a get (with its lookup) and a
// watch.
func BenchmarkDecide(b *testing.B) {
	lookup := func(string, string) (nodeauthz.Binding, bool) { return nodeauthz.Binding{Node: "mac-a"}, true }
	get := nodeauthz.Request{User: "system:serviceaccount:macfleet-nodes:mac-a", Verb: "get", Group: "macfleet.dev",
		Resource: "modelreplicas", Namespace: "team-a", Name: "r"}
	watch := nodeauthz.Request{User: get.User, Verb: "watch", Group: "macfleet.dev", Resource: "modelreplicas",
		FieldSelector: []nodeauthz.Requirement{{Key: "spec.nodeName", Operator: "In", Values: []string{"mac-a"}}}}
	for b.Loop() {
		if !nodeauthz.Decide(get, lookup).Allowed || !nodeauthz.Decide(watch, lookup).Allowed {
			b.Fatal("denied")
		}
	}
}

// BenchmarkAuthorization measures what the node authorizer costs a node's reads,
// against the same reads granted by RBAC (the weaker mode), interleaved in one API
// server, each request new to the API server's authorization cache, as an agent's first
// list is:
//
//   - sar: a SubjectAccessReview of a field-selected list (the authorization alone);
//
//   - list: the field-selected list itself, over 200 replicas bound to 20 Macs.
//
//     go test ./internal/nodeauthz -run '^$' -bench Authorization -benchtime 300x
func BenchmarkAuthorization(b *testing.B) {
	env := serve(b)
	ctx := b.Context()
	ns := testenv.NewNamespace(b, env.Client)
	for i := range 200 {
		if err := env.Client.Create(ctx, newReplica(ns, "r"+strconv.Itoa(i), "mac-"+strconv.Itoa(i%20))); err != nil {
			b.Fatal(err)
		}
	}
	// The baseline: readers of every replica by RBAC, as node identities are in mode rbac.
	const readers = "macfleet-bench-readers"
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: readers}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"modelreplicas"}, Verbs: []string{"get", "list", "watch"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: readers},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: readers},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "Group", Name: readers}}}
	for _, o := range []client.Object{role, binding} {
		if err := env.Client.Create(ctx, o); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = env.Client.Delete(ctx, o) })
	}
	// Node mac-3 has 10 of the replicas. A term the agent does not add (metadata.name
	// != a fresh nonce) makes every request's attributes new, so that no decision comes
	// from the API server's authorization cache: each is an agent's first list.
	identities := map[string]struct {
		user   string
		groups []string
	}{
		"rbac":    {"bench-reader", []string{readers}},
		"webhook": {"system:serviceaccount:macfleet-nodes:mac-3", []string{"system:serviceaccounts", "system:serviceaccounts:macfleet-nodes"}},
	}
	clients := map[string]client.Client{}
	for mode, id := range identities {
		clients[mode] = as(b, env, id.user, id.groups...)
	}
	modes := []string{"rbac", "webhook"}
	sarTimes, listTimes := map[string][]time.Duration{}, map[string][]time.Duration{}
	i := 0
	for b.Loop() {
		for _, mode := range modes {
			i++
			id := identities[mode]
			attrs := authzv1.ResourceAttributes{Verb: "list", Group: v1alpha1.GroupVersion.Group, Resource: "modelreplicas",
				FieldSelector: &authzv1.FieldSelectorAttributes{Requirements: []metav1.FieldSelectorRequirement{
					{Key: v1alpha1.ReplicaNodeNameField, Operator: metav1.FieldSelectorOpIn, Values: []string{"mac-3"}},
					{Key: "metadata.name", Operator: metav1.FieldSelectorOpNotIn, Values: []string{"nonce-" + strconv.Itoa(i)}}}}}
			start := time.Now()
			if !sar(b, env.Client, id.user, id.groups, attrs) {
				b.Fatalf("%s: %s may not list its replicas", mode, id.user)
			}
			sarTimes[mode] = append(sarTimes[mode], time.Since(start))

			i++
			sel := fields.AndSelectors(fields.OneTermEqualSelector(v1alpha1.ReplicaNodeNameField, "mac-3"),
				fields.OneTermNotEqualSelector("metadata.name", "nonce-"+strconv.Itoa(i)))
			var list v1alpha1.ModelReplicaList
			start = time.Now()
			if err := clients[mode].List(ctx, &list, client.MatchingFieldsSelector{Selector: sel}); err != nil {
				b.Fatalf("%s: %v", mode, err)
			}
			listTimes[mode] = append(listTimes[mode], time.Since(start))
			if len(list.Items) != 10 {
				b.Fatalf("%s: listed %d replicas, want 10", mode, len(list.Items))
			}
		}
	}
	b.StopTimer()
	p50 := func(xs []time.Duration) time.Duration {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[len(s)/2]
	}
	p99 := func(xs []time.Duration) time.Duration {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[min(len(s)-1, len(s)*99/100)]
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
	for _, m := range []struct {
		name  string
		times map[string][]time.Duration
	}{{"sar", sarTimes}, {"list", listTimes}} {
		r, w := m.times["rbac"], m.times["webhook"]
		b.ReportMetric(us(p50(r)), m.name+"-rbac-p50-µs")
		b.ReportMetric(us(p50(w)), m.name+"-webhook-p50-µs")
		b.ReportMetric(float64(p50(w))/float64(p50(r)), m.name+"-webhook/rbac")
		fmt.Printf("%s, %d interleaved pairs: p50 %.0f µs by RBAC, %.0f µs through the node authorizer (%.2fx, +%.0f µs); p99 %.0f / %.0f µs\n",
			m.name, len(r), us(p50(r)), us(p50(w)), float64(p50(w))/float64(p50(r)), us(p50(w)-p50(r)), us(p99(r)), us(p99(w)))
	}
}
