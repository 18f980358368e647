package fleetquota

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

func replica(name, dep, mem, node string, opts ...func(*v1alpha1.ModelReplica)) v1alpha1.ModelReplica {
	r := v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelDeployment: dep}},
		Spec:       v1alpha1.ModelReplicaSpec{MemoryReservation: resource.MustParse(mem), NodeName: node},
	}
	for _, o := range opts {
		o(&r)
	}
	return r
}

func scheduled(status metav1.ConditionStatus, reason string) func(*v1alpha1.ModelReplica) {
	return func(r *v1alpha1.ModelReplica) {
		r.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ReplicaScheduled, Status: status, Reason: reason}}
	}
}

func deleting(r *v1alpha1.ModelReplica) { r.DeletionTimestamp = &metav1.Time{} }

func gi(n int64) resource.Quantity { return *resource.NewQuantity(n<<30, resource.BinarySI) }

func TestQuotaStatus(t *testing.T) {
	quotaExceeded := scheduled(metav1.ConditionFalse, v1alpha1.ReasonQuotaExceeded)
	tests := []struct {
		name     string
		replicas []v1alpha1.ModelReplica
		want     v1alpha1.FleetQuotaStatus
	}{
		{name: "no replicas", want: v1alpha1.FleetQuotaStatus{Used: new(gi(0))}},
		{
			name: "bound replicas count by deployment, largest first; unbound ones wait or not",
			replicas: []v1alpha1.ModelReplica{
				replica("a-1", "a", "4Gi", "m1"),
				replica("a-2", "a", "4Gi", "m2"),
				replica("b-1", "b", "10Gi", "m1"),
				replica("c-1", "c", "4Gi", "m1", deleting), // still holds its memory
				replica("a-3", "a", "4Gi", "", quotaExceeded),
				replica("b-2", "b", "10Gi", "", scheduled(metav1.ConditionFalse, "InsufficientMemory")),
				replica("b-3", "b", "10Gi", "", quotaExceeded, deleting),
				replica("x", "", "1Gi", "m3"),
			},
			want: v1alpha1.FleetQuotaStatus{Used: new(gi(23)), WaitingReplicas: 1, Deployments: []v1alpha1.FleetQuotaDeployment{
				{Name: "b", Replicas: 1, Memory: gi(10)},
				{Name: "a", Replicas: 2, Memory: gi(8)},
				{Name: "c", Replicas: 1, Memory: gi(4)},
			}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, quotaStatus(tt.replicas)); diff != "" {
				t.Errorf("quotaStatus (-want +got):\n%s", diff)
			}
		})
	}
}

func TestQuotaStatusKeepsTheLargestDeployments(t *testing.T) {
	var reps []v1alpha1.ModelReplica
	for i := range maxDeployments + 5 {
		reps = append(reps, replica(fmt.Sprint("r", i), fmt.Sprint("d", i), fmt.Sprint(i+1, "Gi"), "m"))
	}
	st := quotaStatus(reps)
	if len(st.Deployments) != maxDeployments || st.Deployments[0].Name != fmt.Sprint("d", maxDeployments+4) {
		t.Errorf("%d deployments, the first %s; want %d, the largest first", len(st.Deployments), st.Deployments[0].Name, maxDeployments)
	}
}

func TestQuotaRelevant(t *testing.T) {
	base := replica("r", "d", "4Gi", "")
	tests := []struct {
		name   string
		change func(*v1alpha1.ModelReplica)
		want   bool
	}{
		{name: "status that is not the quota's", change: func(r *v1alpha1.ModelReplica) { r.Status.Phase = v1alpha1.ReplicaDownloading }},
		{name: "bound", change: func(r *v1alpha1.ModelReplica) { r.Spec.NodeName = "m" }, want: true},
		{name: "held back", change: scheduled(metav1.ConditionFalse, v1alpha1.ReasonQuotaExceeded), want: true},
		{name: "another reason", change: scheduled(metav1.ConditionFalse, "InsufficientMemory")},
		{name: "being deleted", change: deleting, want: true},
		{name: "resized", change: func(r *v1alpha1.ModelReplica) { r.Spec.MemoryReservation = resource.MustParse("5Gi") }, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cur := base.DeepCopy()
			tt.change(cur)
			if got := quotaRelevant(&base, cur); got != tt.want {
				t.Errorf("quotaRelevant = %v, want %v", got, tt.want)
			}
		})
	}
}
