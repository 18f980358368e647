package v1alpha1_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

// TestAutoscalingValidation applies spec.autoscaling variants to the real API server:
// each is accepted, or rejected with the human message of the rule it breaks.
func TestAutoscalingValidation(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	cases := []struct {
		name    string
		as      mfv1.AutoscalingSpec
		raw     map[string]any // set instead of as, for values the Go type cannot express
		wantErr string
	}{
		{name: "max only", as: mfv1.AutoscalingSpec{MaxReplicas: 4}},
		{name: "scale to zero", as: mfv1.AutoscalingSpec{MinReplicas: ptr.To[int32](0), MaxReplicas: 1}},
		{name: "everything", as: mfv1.AutoscalingSpec{MinReplicas: ptr.To[int32](2), MaxReplicas: 8, TargetInFlight: ptr.To[int32](3),
			ScaleDownDelay: dur(90 * time.Second), StabilizationWindow: dur(0)}},
		{name: "min equals max", as: mfv1.AutoscalingSpec{MinReplicas: ptr.To[int32](3), MaxReplicas: 3}},
		{name: "min above max", as: mfv1.AutoscalingSpec{MinReplicas: ptr.To[int32](5), MaxReplicas: 2},
			wantErr: "autoscaling.minReplicas must not exceed autoscaling.maxReplicas"},
		{name: "zero max", raw: map[string]any{"maxReplicas": 0},
			wantErr: "autoscaling.maxReplicas must be between 1 and 1024"},
		{name: "missing max", raw: map[string]any{"minReplicas": 1},
			wantErr: "spec.autoscaling.maxReplicas: Required value"},
		{name: "max too large", as: mfv1.AutoscalingSpec{MaxReplicas: 2000},
			wantErr: "autoscaling.maxReplicas must be between 1 and 1024"},
		{name: "negative min", as: mfv1.AutoscalingSpec{MinReplicas: ptr.To[int32](-1), MaxReplicas: 2},
			wantErr: "autoscaling.minReplicas must not be negative"},
		{name: "zero target", as: mfv1.AutoscalingSpec{MaxReplicas: 2, TargetInFlight: ptr.To[int32](0)},
			wantErr: "autoscaling.targetInFlight must be between 1 and 4096 requests"},
		{name: "delay in words", raw: map[string]any{"maxReplicas": 2, "scaleDownDelay": "5 minutes"},
			wantErr: "autoscaling.scaleDownDelay must be a duration such as 90s or 5m, at most 24h"},
		{name: "negative delay", raw: map[string]any{"maxReplicas": 2, "scaleDownDelay": "-1m"},
			wantErr: "autoscaling.scaleDownDelay must be a duration such as 90s or 5m, at most 24h"},
		{name: "delay too long", as: mfv1.AutoscalingSpec{MaxReplicas: 2, ScaleDownDelay: dur(25 * time.Hour)},
			wantErr: "autoscaling.scaleDownDelay must be a duration such as 90s or 5m, at most 24h"},
		{name: "compound delay", raw: map[string]any{"maxReplicas": 2, "scaleDownDelay": "1h30m"}},
		{name: "window too long", as: mfv1.AutoscalingSpec{MaxReplicas: 2, StabilizationWindow: dur(2 * time.Hour)},
			wantErr: "autoscaling.stabilizationWindow must be a duration such as 0s, 30s or 2m, at most 1h"},
		{name: "window without unit", raw: map[string]any{"maxReplicas": 2, "stabilizationWindow": "30"},
			wantErr: "autoscaling.stabilizationWindow must be a duration such as 0s, 30s or 2m, at most 1h"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := "as-" + strconv.Itoa(i)
			var err error
			if tc.raw != nil {
				u := map[string]any{
					"apiVersion": mfv1.GroupVersion.String(), "kind": "ModelDeployment",
					"metadata": map[string]any{"namespace": ns, "name": name},
					"spec":     map[string]any{"model": map[string]any{"source": validDeployment().Model.Source}, "autoscaling": tc.raw},
				}
				err = createUnstructured(t, u)
			} else {
				spec := validDeployment()
				spec.Autoscaling = &tc.as
				err = env.Client.Create(t.Context(), &mfv1.ModelDeployment{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec})
			}
			checkErr(t, err, tc.wantErr)
		})
	}
}

// TestAutoscalingDefaults checks the defaults the API server fills in: one replica at
// least, 5m before scaling down, 30s of sustained load before scaling up, and no
// target (the autoscaler uses engine.parallel).
func TestAutoscalingDefaults(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	spec := validDeployment()
	spec.Autoscaling = &mfv1.AutoscalingSpec{MaxReplicas: 3}
	md := &mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "as-defaults"}, Spec: spec}
	if err := env.Client.Create(t.Context(), md); err != nil {
		t.Fatalf("creating: %v", err)
	}
	want := &mfv1.AutoscalingSpec{MinReplicas: ptr.To[int32](1), MaxReplicas: 3,
		ScaleDownDelay: dur(5 * time.Minute), StabilizationWindow: dur(30 * time.Second)}
	if diff := cmp.Diff(want, md.Spec.Autoscaling); diff != "" {
		t.Errorf("defaulted autoscaling (-want +got):\n%s", diff)
	}
}

// TestScaleSubresourceWithAutoscaling proves the scale subresource keeps working on an
// autoscaled deployment (it is how the autoscaler's peers, an HPA or a KEDA
// ScaledObject, drive replicas), and that the autoscaler's status fields are stored.
func TestScaleSubresourceWithAutoscaling(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	ctx := t.Context()
	spec := validDeployment()
	spec.Autoscaling = &mfv1.AutoscalingSpec{MinReplicas: ptr.To[int32](0), MaxReplicas: 3}
	md := &mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "as-scale"}, Spec: spec}
	if err := env.Client.Create(ctx, md); err != nil {
		t.Fatalf("creating: %v", err)
	}
	scale := &autoscalingv1.Scale{}
	if err := env.Client.SubResource("scale").Get(ctx, md, scale); err != nil {
		t.Fatalf("getting scale: %v", err)
	}
	if scale.Spec.Replicas != 1 {
		t.Errorf("scale.spec.replicas = %d, want 1", scale.Spec.Replicas)
	}
	scale.Spec.Replicas = 2
	if err := env.Client.SubResource("scale").Update(ctx, md, client.WithSubResourceBody(scale)); err != nil {
		t.Fatalf("updating scale: %v", err)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(md), md); err != nil {
		t.Fatal(err)
	}
	if got := ptr.Deref(md.Spec.Replicas, -1); got != 2 {
		t.Errorf("spec.replicas after scaling = %d, want 2", got)
	}

	now := metav1.NewTime(time.Now().Truncate(time.Second))
	md.Status.Autoscaling = &mfv1.AutoscalingStatus{RecommendedReplicas: 2, Reason: mfv1.ReasonScaledUp, LastScaleTime: &now}
	if err := env.Client.Status().Update(ctx, md); err != nil {
		t.Fatalf("writing status.autoscaling: %v", err)
	}
	got := &mfv1.ModelDeployment{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(md), got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(md.Status.Autoscaling, got.Status.Autoscaling); diff != "" {
		t.Errorf("status.autoscaling (-want +got):\n%s", diff)
	}
}

// createUnstructured creates an object given as JSON-shaped maps, for values the typed
// client cannot send.
func createUnstructured(t *testing.T, obj map[string]any) error {
	t.Helper()
	return env.Client.Create(t.Context(), &unstructured.Unstructured{Object: obj})
}
