package routing

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

// Builders of the API objects the table is computed from.

func deployment(ns, name, served string, aliases ...string) mfv1.ModelDeployment {
	return mfv1.ModelDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: mfv1.ModelDeploymentSpec{Model: mfv1.ModelSource{Source: "file:///m.gguf", ServedName: served,
			Aliases: aliases}, Replicas: ptr.To[int32](1)},
	}
}

func node(name string, ready metav1.ConditionStatus) mfv1.MacNode {
	return mfv1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: mfv1.MacNodeStatus{Conditions: []metav1.Condition{{Type: mfv1.MacNodeReady, Status: ready,
			Reason: mfv1.ReasonAgentReady}}}}
}

func replica(ns, name, dep, nodeName, endpoint string, ready metav1.ConditionStatus) mfv1.ModelReplica {
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

func withParallel(r mfv1.ModelReplica, n int32) mfv1.ModelReplica {
	r.Spec.Template.Engine.Parallel = n
	return r
}

func withContext(r mfv1.ModelReplica, n int32) mfv1.ModelReplica {
	r.Spec.Template.Engine.ContextLength = n
	return r
}
