package v1alpha1_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestFleetQuotaValidation applies FleetQuotas to the real API server: a whole,
// non-negative memory is accepted; anything else is rejected with the rule's message.
func TestFleetQuotaValidation(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	cases := []struct {
		memory  string
		wantErr string
	}{
		{memory: "64Gi"},
		{memory: "0"},
		{memory: "1500M"},
		{memory: "-1Gi", wantErr: "memory must be a whole, non-negative number of bytes, such as 64Gi"},
		{memory: "100m", wantErr: "memory must be a whole, non-negative number of bytes"},
		{memory: "0.5", wantErr: "memory must be a whole, non-negative number of bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.memory, func(t *testing.T) {
			fq := &mfv1.FleetQuota{ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "quota-"},
				Spec: mfv1.FleetQuotaSpec{Memory: resource.MustParse(tc.memory)}}
			checkErr(t, env.Client.Create(t.Context(), fq), tc.wantErr)
		})
	}

	// spec.memory is required.
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": mfv1.GroupVersion.String(), "kind": "FleetQuota",
		"metadata": map[string]any{"namespace": ns, "name": "no-memory"},
		"spec":     map[string]any{},
	}}
	checkErr(t, env.Client.Create(t.Context(), u), "spec.memory: Required value")
}
