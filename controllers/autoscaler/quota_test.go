package autoscaler

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

const gib = int64(1) << 30

func TestLimitByQuota(t *testing.T) {
	room := QuotaRoom{Quota: "team", Limit: 16 * gib, Others: 4 * gib, PerReplica: 4 * gib} // fits 3
	up := func(to int32) Recommendation {
		return Recommendation{Replicas: to, Reason: v1alpha1.ReasonScaledUp, Message: fmt.Sprintf("scaled up to %d", to)}
	}
	tests := []struct {
		name    string
		rec     Recommendation
		current int32
		room    QuotaRoom
		ok      bool
		want    Recommendation
	}{
		{name: "no quota", rec: up(8), current: 1, want: up(8)},
		{name: "within the room", rec: up(3), current: 1, room: room, ok: true, want: up(3)},
		{name: "beyond the room: up to what fits", rec: up(8), current: 1, room: room, ok: true,
			want: Recommendation{Replicas: 3, Reason: v1alpha1.ReasonScaledUp, Message: "scaled up from 1 to 3: the load needs 8, " +
				"and FleetQuota team (16Gi) has room for 3 replicas of 4Gi beside the 4Gi the namespace's other deployments reserve"}},
		{name: "at the room: hold with AtQuota", rec: up(8), current: 3, room: room, ok: true,
			want: Recommendation{Replicas: 3, Reason: v1alpha1.ReasonAtQuota, Message: "the load needs more than 3 replicas, " +
				"and FleetQuota team (16Gi) has room for 3 replicas of 4Gi beside the 4Gi the namespace's other deployments reserve; " +
				"raise the quota or scale down another deployment"}},
		{name: "above the room (others grew): never down for the quota", rec: up(8), current: 5, room: room, ok: true,
			want: Recommendation{Replicas: 5, Reason: v1alpha1.ReasonAtQuota, Message: "the load needs more than 5 replicas, " +
				"and FleetQuota team (16Gi) has room for 3 replicas of 4Gi beside the 4Gi the namespace's other deployments reserve; " +
				"raise the quota or scale down another deployment"}},
		{name: "a scale-down is the load's business", current: 5, room: room, ok: true,
			rec:  Recommendation{Replicas: 4, Reason: v1alpha1.ReasonScaledDown, Message: "down"},
			want: Recommendation{Replicas: 4, Reason: v1alpha1.ReasonScaledDown, Message: "down"}},
		{name: "others over the limit: no room at all", rec: up(1), current: 0, ok: true,
			room: QuotaRoom{Quota: "team", Limit: 4 * gib, Others: 6 * gib, PerReplica: gib},
			want: Recommendation{Replicas: 0, Reason: v1alpha1.ReasonAtQuota, Message: "the load needs more than 0 replicas, " +
				"and FleetQuota team (4Gi) has room for 0 replicas of 1Gi beside the 6Gi the namespace's other deployments reserve; " +
				"raise the quota or scale down another deployment"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, limitByQuota(tt.rec, tt.current, tt.room, tt.ok)); diff != "" {
				t.Errorf("limitByQuota (-want +got):\n%s", diff)
			}
		})
	}
}

func TestQuotaRoom(t *testing.T) {
	q := func(ns, name, mem string) v1alpha1.FleetQuota {
		return v1alpha1.FleetQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1alpha1.FleetQuotaSpec{Memory: resource.MustParse(mem)}}
	}
	rep := func(dep, mem, node string) v1alpha1.ModelReplica {
		return v1alpha1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Labels: map[string]string{v1alpha1.LabelDeployment: dep}},
			Spec: v1alpha1.ModelReplicaSpec{MemoryReservation: resource.MustParse(mem), NodeName: node}}
	}
	md := autoscaled("chat", v1alpha1.AutoscalingSpec{MaxReplicas: 8})
	md.Namespace = "ns"
	md.Status.EstimatedMemory = ptr.To(resource.MustParse("4Gi"))
	replicas := []v1alpha1.ModelReplica{rep("chat", "4Gi", "m1"), rep("chat", "4Gi", ""), rep("other", "6Gi", "m1"), rep("other", "6Gi", "")}

	room, ok := quotaRoom(md, []v1alpha1.FleetQuota{q("ns", "big", "64Gi"), q("ns", "team", "32Gi"), q("elsewhere", "tiny", "1Gi")}, replicas)
	want := QuotaRoom{Quota: "team", Limit: 32 * gib, Others: 6 * gib, PerReplica: 4 * gib}
	if !ok || room != want {
		t.Errorf("quotaRoom = %+v, %v; want %+v (the smallest quota of the namespace, only the others' placed replicas)", room, ok, want)
	}
	if got := room.Fits(); got != 6 {
		t.Errorf("Fits = %d, want 6", got)
	}
	if _, ok := quotaRoom(md, []v1alpha1.FleetQuota{q("elsewhere", "tiny", "1Gi")}, replicas); ok {
		t.Error("a quota of another namespace applies")
	}
	md.Status.EstimatedMemory = nil
	if _, ok := quotaRoom(md, []v1alpha1.FleetQuota{q("ns", "team", "32Gi")}, replicas); ok {
		t.Error("a room without the deployment's reservation")
	}
}

// TestAutoscalerStopsAtQuota: a FleetQuota of 8Gi with the deployment's replicas
// reserving 3Gi each has room for 2; a load that needs 5 scales the deployment up to
// 2 with an Event saying why, then holds it there with AtQuota, writing nothing more
// as the measurements go on (no flapping). Raising the quota lets it scale on.
func TestAutoscalerStopsAtQuota(t *testing.T) {
	f := start(t)
	const name = "chat"
	fq := &v1alpha1.FleetQuota{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "team"},
		Spec: v1alpha1.FleetQuotaSpec{Memory: resource.MustParse("8Gi")}}
	if err := f.e.Client.Create(t.Context(), fq); err != nil {
		t.Fatal(err)
	}
	md := autoscaled(name, v1alpha1.AutoscalingSpec{MinReplicas: ptr.To[int32](1), MaxReplicas: 8, TargetInFlight: ptr.To[int32](2),
		StabilizationWindow: &metav1.Duration{Duration: 0}})
	f.create(md)
	// The deployment controller's part: the reservation per replica.
	before := md.DeepCopy()
	md.Status.EstimatedMemory = ptr.To(resource.MustParse("3Gi"))
	if err := f.e.Client.Status().Patch(t.Context(), md, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	f.waitFor(name, 1, v1alpha1.ReasonWithinTarget, "")

	f.tick(name, 10*time.Second, Load{InFlight: 10})
	f.waitScaled(name, 2, v1alpha1.ReasonScaledUp, "scaled up from 1 to 2: the load needs 5, and FleetQuota team (8Gi) has room for 2 replicas of 3Gi")
	f.tick(name, 10*time.Second, Load{InFlight: 10})
	f.waitFor(name, 2, v1alpha1.ReasonAtQuota, "the load needs more than 2 replicas, and FleetQuota team (8Gi) has room for 2 replicas of 3Gi "+
		"beside the 0 the namespace's other deployments reserve; raise the quota or scale down another deployment")
	writesBefore := writes(f, name)
	for range 10 {
		f.tick(name, 10*time.Second, Load{InFlight: 10 + int32(f.src.count(name)%3)})
	}
	if md := f.get(name); ptr.Deref(md.Spec.Replicas, 0) != 2 {
		t.Fatalf("%d replicas at the quota, want 2", *md.Spec.Replicas)
	}
	if after := writes(f, name); after != writesBefore {
		t.Errorf("at the quota the autoscaler wrote %v times over 10 measurements, want 0", after-writesBefore)
	}

	testenv.Eventually(t, wait, poll, func() (bool, string) {
		if err := f.e.Client.Get(t.Context(), client.ObjectKeyFromObject(fq), fq); err != nil {
			return false, err.Error()
		}
		fq.Spec.Memory = resource.MustParse("15Gi")
		err := f.e.Client.Update(t.Context(), fq)
		return err == nil, fmt.Sprint(err)
	})
	f.tick(name, 10*time.Second, Load{InFlight: 10})
	f.waitScaled(name, 5, v1alpha1.ReasonScaledUp, "scaled up from 2 to 5")
}
