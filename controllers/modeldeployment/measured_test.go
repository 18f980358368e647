package modeldeployment

import (
	"fmt"
	"maps"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/test/support/testenv"
)

const mi = int64(1) << 20

// measuredReplica is a loaded replica of md's template that reports peak and
// resident bytes (0: not reported).
func measuredReplica(md *v1alpha1.ModelDeployment, peak, resident int64) v1alpha1.ModelReplica {
	var mr v1alpha1.ModelReplica
	mr.Spec.Template = replicaTemplate(md)
	if peak > 0 {
		mr.Status.Memory.Peak = resource.NewQuantity(peak, resource.BinarySI)
	}
	if resident > 0 {
		mr.Status.Memory.Resident = resource.NewQuantity(resident, resource.BinarySI)
	}
	return mr
}

// measuredGang is measuredReplica bound as a gang of two Macs: what it reports is
// its head's process.
func measuredGang(md *v1alpha1.ModelDeployment, peak, resident int64) v1alpha1.ModelReplica {
	mr := measuredReplica(md, peak, resident)
	mr.Spec.NodeName, mr.Spec.Split = "mac-a", splitReplica("mac-a", "mac-b").Spec.Split
	return mr
}

func TestWithMeasurement(t *testing.T) {
	base := deployment(nil)
	estimated := func(n int64) reservation { return reservation{Quantity: resource.NewQuantity(n, resource.BinarySI)} }
	other := func(mutate func(*v1alpha1.ModelDeployment)) *v1alpha1.ModelDeployment { return deployment(mutate) }
	tests := []struct {
		name         string
		res          reservation
		replicas     []v1alpha1.ModelReplica
		want         int64 // 0: res unchanged
		wantMeasured int64
	}{
		{name: "no replica", res: estimated(400 * mi)},
		{name: "loaded but not measured", res: estimated(400 * mi), replicas: []v1alpha1.ModelReplica{measuredReplica(base, 0, 0)}},
		{name: "estimate far above: capped at 1.3x", res: estimated(618 * mi),
			replicas: []v1alpha1.ModelReplica{measuredReplica(base, 100*mi, 90*mi)}, want: 130 * mi, wantMeasured: 100 * mi},
		{name: "estimate within bounds: kept", res: estimated(120 * mi),
			replicas: []v1alpha1.ModelReplica{measuredReplica(base, 100*mi, 90*mi)}, want: 120 * mi, wantMeasured: 100 * mi},
		{name: "estimate below the peak: floor 1.1x", res: estimated(80 * mi),
			replicas: []v1alpha1.ModelReplica{measuredReplica(base, 100*mi, 90*mi)}, want: 110 * mi, wantMeasured: 100 * mi},
		{name: "largest of every replica, resident above peak counts", res: estimated(618 * mi),
			replicas: []v1alpha1.ModelReplica{measuredReplica(base, 100*mi, 0), measuredReplica(base, 150*mi, 200*mi)},
			want:     260 * mi, wantMeasured: 200 * mi},
		{name: "rounded up to MiB", res: estimated(618 * mi),
			replicas: []v1alpha1.ModelReplica{measuredReplica(base, 100*mi+1, 0)}, want: 131 * mi, wantMeasured: 100*mi + 1},
		{name: "other aliases, residency and name: same footprint", res: estimated(618 * mi),
			replicas: []v1alpha1.ModelReplica{measuredReplica(other(func(md *v1alpha1.ModelDeployment) {
				md.Name, md.Spec.Model.Aliases, md.Spec.Residency = "other", []string{"chat"}, v1alpha1.ResidencyPinned
			}), 100*mi, 0)}, want: 130 * mi, wantMeasured: 100 * mi},
		{name: "other context: not measured", res: estimated(618 * mi),
			replicas: []v1alpha1.ModelReplica{measuredReplica(other(func(md *v1alpha1.ModelDeployment) {
				md.Spec.Engine.ContextLength = 8192
			}), 100*mi, 0)}},
		{name: "other model: not measured", res: estimated(618 * mi),
			replicas: []v1alpha1.ModelReplica{measuredReplica(other(func(md *v1alpha1.ModelDeployment) {
				md.Spec.Model.Source = "hf://Qwen/Qwen2.5-GGUF/q8.gguf"
			}), 100*mi, 0)}},
		{name: "other checksum: not measured", res: estimated(618 * mi),
			replicas: []v1alpha1.ModelReplica{measuredReplica(other(func(md *v1alpha1.ModelDeployment) {
				md.Spec.Model.SHA256 = "ab"
			}), 100*mi, 0)}},
		{name: "with a draft model: not measured", res: estimated(618 * mi),
			replicas: []v1alpha1.ModelReplica{measuredReplica(other(func(md *v1alpha1.ModelDeployment) {
				md.Spec.Model.Draft = "https://models.example/draft.gguf"
			}), 100*mi, 0)}},
		{name: "with a projector: not measured", res: estimated(618 * mi),
			replicas: []v1alpha1.ModelReplica{measuredReplica(other(func(md *v1alpha1.ModelDeployment) {
				md.Spec.Model.Projector = "https://models.example/mmproj.gguf"
			}), 100*mi, 0)}},
		{name: "split replica: its head's footprint is not the model's", res: estimated(618 * mi),
			replicas: []v1alpha1.ModelReplica{measuredGang(base, 100*mi, 90*mi)}},
		{name: "split and whole replicas: the whole one's", res: estimated(618 * mi),
			replicas: []v1alpha1.ModelReplica{measuredGang(base, 300*mi, 0), measuredReplica(base, 100*mi, 0)},
			want:     130 * mi, wantMeasured: 100 * mi},
		{name: "explicit memory: never moved", res: reservation{Quantity: resource.NewQuantity(618*mi, resource.BinarySI), Explicit: true},
			replicas: []v1alpha1.ModelReplica{measuredReplica(base, 100*mi, 0)}},
		{name: "unknown reservation stays unknown", res: reservation{},
			replicas: []v1alpha1.ModelReplica{measuredReplica(base, 100*mi, 0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, ok := measuredFootprint(replicaTemplate(base), tt.replicas, &v1alpha1.ModelDeploymentStatus{})
			if ok != (m > 0) {
				t.Fatalf("measured %d, ok %v", m, ok)
			}
			got := withMeasurement(tt.res, m)
			if tt.want == 0 {
				if got.Quantity != tt.res.Quantity || got.Measured != 0 {
					t.Errorf("reservation %v (measured %d), want %v unchanged", got.Quantity, got.Measured, tt.res.Quantity)
				}
				return
			}
			if got.Quantity == nil || got.Quantity.Value() != tt.want || got.Measured != tt.wantMeasured {
				t.Errorf("reservation %v (measured %d), want %d bytes (measured %d)", got.Quantity, got.Measured, tt.want, tt.wantMeasured)
			}
		})
	}
}

// What status kept counts as a measurement while it names the same model and engine
// settings, beside (and below) what replicas report now.
func TestMeasuredFootprintKeptInStatus(t *testing.T) {
	base := deployment(nil)
	tmpl := replicaTemplate(base)
	kept := func(n int64, hash string) *v1alpha1.ModelDeploymentStatus {
		return &v1alpha1.ModelDeploymentStatus{MeasuredMemory: resource.NewQuantity(n, resource.BinarySI), MeasuredFootprintHash: hash}
	}
	otherCtx := replicaTemplate(deployment(func(md *v1alpha1.ModelDeployment) { md.Spec.Engine.ContextLength = 8192 }))
	aliased := replicaTemplate(deployment(func(md *v1alpha1.ModelDeployment) { md.Spec.Model.Aliases = []string{"chat"} }))
	drafted := replicaTemplate(deployment(func(md *v1alpha1.ModelDeployment) { md.Spec.Model.Draft = "https://models.example/draft.gguf" }))
	tests := []struct {
		name     string
		status   *v1alpha1.ModelDeploymentStatus
		replicas []v1alpha1.ModelReplica
		want     int64 // 0: none
	}{
		{name: "nothing measured", status: &v1alpha1.ModelDeploymentStatus{}},
		{name: "kept, no replica: scaled to zero", status: kept(100*mi, footprintHash(tmpl)), want: 100 * mi},
		{name: "kept for an alias change: same footprint", status: kept(100*mi, footprintHash(aliased)), want: 100 * mi},
		{name: "kept for another context: dropped", status: kept(100*mi, footprintHash(otherCtx))},
		{name: "kept with a draft model: dropped", status: kept(100*mi, footprintHash(drafted))},
		{name: "kept before the hash existed: dropped", status: kept(100*mi, "")},
		{name: "a replica measures more than was kept", status: kept(100*mi, footprintHash(tmpl)),
			replicas: []v1alpha1.ModelReplica{measuredReplica(base, 120*mi, 0)}, want: 120 * mi},
		{name: "a replica measures less than was kept: the larger peak stays", status: kept(100*mi, footprintHash(tmpl)),
			replicas: []v1alpha1.ModelReplica{measuredReplica(base, 80*mi, 0)}, want: 100 * mi},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := measuredFootprint(tmpl, tt.replicas, tt.status)
			if got != tt.want || ok != (tt.want > 0) {
				t.Errorf("measured %d (ok %v), want %d", got, ok, tt.want)
			}
		})
	}
	if footprintHash(tmpl) != footprintHash(aliased) || footprintHash(tmpl) == footprintHash(otherCtx) || footprintHash(tmpl) == footprintHash(drafted) {
		t.Error("the footprint hash must follow the model, its projector and draft, and the engine settings, and only them")
	}
}

// startMeasured runs the controller against a GGUF server and creates deployment
// name (one replica, context 2048); it checks that the first replica reserves the
// estimate, then plays its agent: the replica loads on mac-a and reports a peak of
// half the estimate (resident 1 MiB less).
func startMeasured(t *testing.T, name string) measuredStart {
	t.Helper()
	srv := newGGUFServer(t, true)
	f := newFixture(t)
	f.start(&Reconciler{Resolver: &modelsource.Resolver{HFEndpoint: srv.URL + "/hub"}})
	md := newDeployment(name, srv.URL+"/model.gguf", 1, "")
	md.Spec.Engine.ContextLength = 2048
	f.create(md)
	est := resource.MustParse(srv.wantReservation(t, 2048))
	first := f.waitReplicas(1)[0]
	if got := first.Spec.MemoryReservation.String(); got != est.String() {
		t.Fatalf("first replica reserves %s, want the estimate %s", got, est.String())
	}
	peak := est.Value() / 2
	f.bind(&first, "mac-a")
	f.markReady(&first)
	before := first.DeepCopy()
	first.Status.Memory.Peak = resource.NewQuantity(peak, resource.BinarySI)
	first.Status.Memory.Resident = resource.NewQuantity(peak-mi, resource.BinarySI)
	if err := f.c.Status().Patch(t.Context(), &first, client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	return measuredStart{f: f, srv: srv, est: est, peak: peak, first: first.Name}
}

// measuredStart is what startMeasured set up: the estimate, the peak the first
// replica reported, and that replica's name.
type measuredStart struct {
	f     *fixture
	srv   *ggufServer
	est   resource.Quantity
	peak  int64
	first string
}

// Through a real API server: a deployment scaled to zero keeps what its replica
// measured, and the replica placed when it scales back reserves by that measurement,
// not the estimate; a new context drops it.
func TestMeasurementOutlivesScaleToZero(t *testing.T) {
	m := startMeasured(t, "zero")
	f, est, peak := m.f, m.est, m.peak
	measuredIs := func(want int64) func(md *v1alpha1.ModelDeployment) (bool, string) {
		return func(md *v1alpha1.ModelDeployment) (bool, string) {
			got := md.Status.MeasuredMemory
			ok := (want == 0 && got == nil && md.Status.MeasuredFootprintHash == "") ||
				(got != nil && got.Value() == want && md.Status.MeasuredFootprintHash == footprintHash(replicaTemplate(md)))
			return ok, fmt.Sprintf("measuredMemory %v (%q), want %d; %d replicas", got, md.Status.MeasuredFootprintHash, want, md.Status.Replicas)
		}
	}
	f.waitStatus("zero", measuredIs(peak))

	f.update("zero", func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To[int32](0) })
	f.waitReplicas(0)
	f.waitStatus("zero", func(md *v1alpha1.ModelDeployment) (bool, string) {
		if md.Status.Replicas != 0 {
			return false, fmt.Sprintf("%d replicas", md.Status.Replicas)
		}
		return measuredIs(peak)(md)
	})

	f.update("zero", func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To[int32](1) })
	woken := f.waitReplicas(1)[0]
	if got, want := woken.Spec.MemoryReservation.String(), roundUpMiB(peak*measuredCapPercent/100).String(); got != want {
		t.Errorf("the replica placed after zero reserves %s, want %s (1.3x the kept measurement; estimate %s)", got, want, est.String())
	}

	f.update("zero", func(md *v1alpha1.ModelDeployment) { md.Spec.Engine.ContextLength = 1024 })
	f.waitStatus("zero", measuredIs(0))
}

// A new deployment of a model and engine settings that another deployment in its
// namespace has measured reserves by that measurement from its first replica; one
// with another context starts from the estimate.
func TestSiblingDeploymentReservesTheMeasurement(t *testing.T) {
	m := startMeasured(t, "measured")
	f := m.f
	f.waitStatus("measured", func(md *v1alpha1.ModelDeployment) (bool, string) {
		q := md.Status.MeasuredMemory
		return q != nil && q.Value() == m.peak, fmt.Sprintf("measuredMemory %v, want %d", q, m.peak)
	})
	sibling := newDeployment("sibling", f.deployment("measured").Spec.Model.Source, 1, "")
	sibling.Spec.Engine.ContextLength = 2048
	f.create(sibling)
	other := newDeployment("other-context", f.deployment("measured").Spec.Model.Source, 1, "")
	other.Spec.Engine.ContextLength = 1024
	f.create(other)
	want := map[string]string{
		"sibling":       roundUpMiB(m.peak * measuredCapPercent / 100).String(),
		"other-context": m.srv.wantReservation(t, 1024),
	}
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		got := map[string]string{}
		for _, r := range f.replicas() {
			if d := r.Labels[v1alpha1.LabelDeployment]; want[d] != "" {
				got[d] = r.Spec.MemoryReservation.String()
			}
		}
		return maps.Equal(got, want), fmt.Sprintf("first replicas reserve %v, want %v", got, want)
	})
}

// Wiring: the first replica reserves the estimate from the GGUF header; once it
// reports its footprint, new replicas — scaled up, or rolled out for an alias —
// reserve at most 1.3× that footprint, and the replica already placed keeps its
// reservation; a new context falls back to the estimate.
func TestLaterReplicasReserveTheMeasuredFootprint(t *testing.T) {
	m := startMeasured(t, "packed")
	f, srv, est, peak := m.f, m.srv, m.est.String(), m.peak
	want := roundUpMiB(peak * measuredCapPercent / 100).String()
	f.waitStatus("packed", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.EstimatedMemory != nil && md.Status.EstimatedMemory.String() == want, fmt.Sprintf("%+v", md.Status)
	})

	f.update("packed", func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To[int32](3) })
	reps := f.waitReplicas(3)
	for _, r := range reps {
		wantR := want
		if r.Name == m.first {
			wantR = est
		}
		if got := r.Spec.MemoryReservation.String(); got != wantR {
			t.Errorf("%s reserves %s, want %s", r.Name, got, wantR)
		}
	}

	// An alias rolls the replicas onto a new template hash; the model and engine are
	// the same, so the new ones reserve by the measurement of the old one.
	f.update("packed", func(md *v1alpha1.ModelDeployment) { md.Spec.Model.Aliases = []string{"chat"} })
	newHash := templateHash(replicaTemplate(f.deployment("packed")))
	f.waitStatus("packed", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.UpdatedReplicas == 3, fmt.Sprintf("%+v", md.Status)
	})
	for _, r := range f.replicas() {
		if r.Spec.TemplateHash == newHash && r.DeletionTimestamp == nil && r.Spec.MemoryReservation.String() != want {
			t.Errorf("rolled replica %s reserves %s, want %s", r.Name, r.Spec.MemoryReservation.String(), want)
		}
	}

	// A new context is a new footprint: back to the estimate.
	f.update("packed", func(md *v1alpha1.ModelDeployment) { md.Spec.Engine.ContextLength = 1024 })
	est1024 := srv.wantReservation(t, 1024)
	ctxHash := templateHash(replicaTemplate(f.deployment("packed")))
	f.waitStatus("packed", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.UpdatedReplicas == 3 && md.Status.EstimatedMemory != nil && md.Status.EstimatedMemory.String() == est1024,
			fmt.Sprintf("%+v", md.Status)
	})
	for _, r := range f.replicas() {
		if r.Spec.TemplateHash == ctxHash && r.DeletionTimestamp == nil && r.Spec.MemoryReservation.String() != est1024 {
			t.Errorf("replica %s of the new context reserves %s, want the estimate %s", r.Name, r.Spec.MemoryReservation.String(), est1024)
		}
	}
}
