// Package fleetobjects builds the API objects a gateway's routing table is computed
// from, for tests: a ModelDeployment, a MacNode and a ModelReplica with the fields
// routing reads.
package fleetobjects

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

// Deployment is a deployment of one replica serving served (and aliases).
func Deployment(ns, name, served string, aliases ...string) mfv1.ModelDeployment {
	return mfv1.ModelDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: mfv1.ModelDeploymentSpec{Model: mfv1.ModelSource{Source: "file:///m.gguf", ServedName: served,
			Aliases: aliases}, Replicas: ptr.To[int32](1)},
	}
}

// MacNode is a Mac whose Ready condition is ready.
func MacNode(name string, ready metav1.ConditionStatus) mfv1.MacNode {
	return mfv1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: mfv1.MacNodeStatus{Conditions: []metav1.Condition{{Type: mfv1.MacNodeReady, Status: ready,
			Reason: mfv1.ReasonAgentReady}}}}
}

// Replica is a replica of deployment dep on nodeName at endpoint, with a Ready
// condition of ready (none when empty).
func Replica(ns, name, dep, nodeName, endpoint string, ready metav1.ConditionStatus) mfv1.ModelReplica {
	r := mfv1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{mfv1.LabelDeployment: dep}},
		Spec:       mfv1.ModelReplicaSpec{NodeName: nodeName},
		Status:     mfv1.ModelReplicaStatus{Endpoint: endpoint},
	}
	if ready != "" {
		r.Status.Conditions = []metav1.Condition{{Type: mfv1.ReplicaReady, Status: ready, Reason: mfv1.ReasonRunnerReady}}
	}
	return r
}

// WithParallel is r with n slots.
func WithParallel(r mfv1.ModelReplica, n int32) mfv1.ModelReplica {
	r.Spec.Template.Engine.Parallel = n
	return r
}

// WithContext is r with a context of n tokens.
func WithContext(r mfv1.ModelReplica, n int32) mfv1.ModelReplica {
	r.Spec.Template.Engine.ContextLength = n
	return r
}
