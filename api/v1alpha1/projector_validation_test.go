package v1alpha1_test

import (
	"strconv"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestProjectorValidation: spec.model.projector takes the schemes of source, and the
// API server refuses what cannot serve images, each with the rule's message.
func TestProjectorValidation(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	memory := &mfv1.ModelResources{Memory: ptr.To(resource.MustParse("2Gi"))}
	for i, tc := range []struct {
		name    string
		mutate  func(*mfv1.ModelDeploymentSpec)
		wantErr string
	}{
		{name: "hf projector", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector = "hf://ggml-org/gemma-3-4b-it-GGUF/mmproj-model-f16.gguf"
		}},
		{name: "https projector with its sha256", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector, s.Model.ProjectorSHA256 = "https://models.example/mmproj.gguf", goodSHA
		}},
		{name: "file projector with memory", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector, s.Resources = "file:///models/mmproj.gguf", memory
		}},
		{name: "unknown scheme", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Model.Projector = "s3://bucket/mmproj.gguf" },
			wantErr: "projector must start with hf://, ollama://, http://, https:// or file:// and name a file"},
		{name: "relative file", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector, s.Resources = "file://models/mmproj.gguf", memory
		}, wantErr: "a file:// projector must be an absolute path"},
		{name: "file projector without memory", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector = "file:///models/mmproj.gguf"
		}, wantErr: "a file:// projector needs resources.memory"},
		{name: "in parts", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector = "hf://org/m-GGUF/mmproj-00001-of-00002.gguf"
		}, wantErr: "a projector is one file: it cannot be stored in parts"},
		{name: "bad sha256", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector, s.Model.ProjectorSHA256 = "https://models.example/mmproj.gguf", "ABC"
		}, wantErr: "projectorSHA256 must be 64 lowercase hexadecimal characters"},
		{name: "sha256 without a projector", mutate: func(s *mfv1.ModelDeploymentSpec) { s.Model.ProjectorSHA256 = goodSHA },
			wantErr: "projectorSHA256 needs projector"},
		{name: "split replicas", mutate: func(s *mfv1.ModelDeploymentSpec) {
			s.Model.Projector = "https://models.example/mmproj.gguf"
			s.Placement = mfv1.Placement{MaxMacsPerReplica: 2}
			s.Residency = mfv1.ResidencyResident
		}, wantErr: "a projector needs every replica on one Mac (placement.maxMacsPerReplica 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := validDeployment()
			tc.mutate(&spec)
			md := &mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "proj-" + strconv.Itoa(i)}, Spec: spec}
			checkErr(t, env.Client.Create(t.Context(), md), tc.wantErr)
		})
	}
}
