package soak

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

func cond(t string, s metav1.ConditionStatus) metav1.Condition {
	return metav1.Condition{Type: t, Status: s, Reason: "Test"}
}

func node(name, committed string) v1alpha1.MacNode {
	n := v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	n.Status.Conditions = []metav1.Condition{cond(v1alpha1.MacNodeReady, metav1.ConditionTrue)}
	n.Status.Memory.Committed = ptr.To(resource.MustParse(committed))
	return n
}

func deploymentOf(name string, replicas int32) v1alpha1.ModelDeployment {
	md := v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "soak", Name: name, Generation: 2}}
	md.Spec.Replicas = ptr.To(replicas)
	md.Status.ObservedGeneration, md.Status.ReadyReplicas = 2, replicas
	return md
}

func replica(deployment, name, node, reservation string, loaded bool) v1alpha1.ModelReplica {
	r := v1alpha1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Namespace: "soak", Name: name,
		Labels: map[string]string{v1alpha1.LabelDeployment: deployment}}}
	r.Spec.NodeName, r.Spec.MemoryReservation = node, resource.MustParse(reservation)
	l := metav1.ConditionFalse
	if loaded {
		l = metav1.ConditionTrue
	}
	r.Status.Conditions = []metav1.Condition{cond(v1alpha1.ReplicaReady, metav1.ConditionTrue), cond(v1alpha1.ReplicaLoaded, l)}
	return r
}

// converged is a fleet that holds every invariant: two Resident replicas of chat, one
// per Mac, and an OnDemand replica on mac-a that is not loaded.
func converged() Snapshot {
	return Snapshot{
		Nodes:       []v1alpha1.MacNode{node("mac-a", "100Mi"), node("mac-b", "100Mi")},
		Deployments: []v1alpha1.ModelDeployment{deploymentOf("chat", 2), deploymentOf("cold", 1)},
		Replicas: []v1alpha1.ModelReplica{
			replica("chat", "chat-1", "mac-a", "100Mi", true),
			replica("chat", "chat-2", "mac-b", "100Mi", true),
			replica("cold", "cold-1", "mac-a", "50Mi", false),
		},
		Runners: []RunnerProcess{{PID: 10, Node: "mac-a"}, {PID: 11, Node: "mac-b"}},
	}
}

func TestCheck(t *testing.T) {
	if v := Check(converged()); v != nil {
		t.Fatalf("Check(converged) = %q, want nothing", v)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Snapshot)
		want   string
	}{
		{"deployment not observed", func(s *Snapshot) { s.Deployments[0].Generation = 3 }, "observed generation 2 of 3"},
		{"deployment short of ready replicas", func(s *Snapshot) { s.Deployments[0].Status.ReadyReplicas = 1 }, "1 ready replicas, wants 2"},
		{"replica not Ready", func(s *Snapshot) {
			s.Replicas[1].Status.Conditions[0].Status = metav1.ConditionFalse
		}, "chat-2 of deployment soak/chat is not Ready"},
		{"replica missing", func(s *Snapshot) {
			s.Replicas = s.Replicas[1:]
			s.Runners = s.Runners[1:]
			s.Nodes[0].Status.Memory.Committed = ptr.To(resource.MustParse("0"))
		}, "soak/chat has 1 replicas, wants 2"},
		{"replica of a deleted deployment", func(s *Snapshot) {
			s.Replicas = append(s.Replicas, replica("gone", "gone-1", "mac-b", "10Mi", false))
		}, "deployment soak/gone, which does not exist"},
		{"replica not bound", func(s *Snapshot) { s.Replicas[2].Spec.NodeName = "" }, "cold-1 is not bound"},
		{"replica bound to a missing Mac", func(s *Snapshot) { s.Replicas[2].Spec.NodeName = "mac-z" }, "bound to mac-z, which does not exist"},
		{"Mac not Ready", func(s *Snapshot) {
			s.Nodes[1].Status.Conditions[0].Status = metav1.ConditionUnknown
		}, "MacNode mac-b is not Ready"},
		{"orphan runner", func(s *Snapshot) {
			s.Runners = append(s.Runners, RunnerProcess{PID: 12, Node: "mac-a"})
		}, "mac-a runs 2 runners for 1 Loaded"},
		{"loaded replica without a runner", func(s *Snapshot) { s.Runners = s.Runners[:1] }, "mac-b runs 0 runners for 1 Loaded"},
		{"runner of a missing Mac", func(s *Snapshot) {
			s.Runners = append(s.Runners, RunnerProcess{PID: 13, Node: "mac-z"})
		}, "runners of Mac mac-z, which does not exist"},
		{"leaked reservation", func(s *Snapshot) {
			s.Nodes[0].Status.Memory.Committed = ptr.To(resource.MustParse("150Mi"))
		}, "mac-a has 150Mi committed, its Loaded replicas reserve 100Mi"},
		{"reservation not committed", func(s *Snapshot) {
			s.Replicas[2].Status.Conditions[1].Status = metav1.ConditionTrue
			s.Runners = append(s.Runners, RunnerProcess{PID: 14, Node: "mac-a"})
		}, "mac-a has 100Mi committed, its Loaded replicas reserve 150Mi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := converged()
			tc.mutate(&s)
			v := Check(s)
			if !strings.Contains(strings.Join(v, "\n"), tc.want) {
				t.Errorf("Check = %q, want a violation containing %q", v, tc.want)
			}
		})
	}
}
