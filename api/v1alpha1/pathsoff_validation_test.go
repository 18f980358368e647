package v1alpha1_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// The API server takes a replica's status.pathsOff with a path it names and a reason,
// and refuses an unknown path, a path twice, or a path without its reason.
func TestModelReplicaPathsOffValidation(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	mr := &mfv1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "r1"},
		Spec: mfv1.ModelReplicaSpec{Template: mfv1.ModelReplicaTemplate{Model: validDeployment().Model},
			TemplateHash: "abc", MemoryReservation: resource.MustParse("1Gi"), NodeName: "mac-a"},
	}
	if err := env.Client.Create(t.Context(), mr); err != nil {
		t.Fatalf("creating: %v", err)
	}
	reason := "off: the model keeps a recurrent state beside its attention cache, which cannot be cut back to a prefix (qwen3next)"
	for _, tc := range []struct {
		name    string
		off     []mfv1.PathOff
		wantErr string
	}{
		{"the prompt cache with its reason", []mfv1.PathOff{{Path: mfv1.ServingPathPromptCache, Reason: reason}}, ""},
		{"none", nil, ""},
		{"an unknown path", []mfv1.PathOff{{Path: "Telepathy", Reason: reason}}, "Unsupported value"},
		{"a path twice", []mfv1.PathOff{{Path: mfv1.ServingPathPromptCache, Reason: "a"},
			{Path: mfv1.ServingPathPromptCache, Reason: "b"}}, "Duplicate value"},
		{"no reason", []mfv1.PathOff{{Path: mfv1.ServingPathPromptCache}}, "reason"},
		{"a reason past its bound", []mfv1.PathOff{{Path: mfv1.ServingPathPromptCache, Reason: strings.Repeat("x", 1025)}},
			"Too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cur mfv1.ModelReplica
			if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(mr), &cur); err != nil {
				t.Fatal(err)
			}
			cur.Status.PathsOff = tc.off
			checkErr(t, env.Client.Status().Update(t.Context(), &cur), tc.wantErr)
		})
	}
}
