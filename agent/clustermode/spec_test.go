package clustermode_test

import (
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/agent/clustermode"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// A replica's runner keeps its prompt cache under the replica's namespace: two
// tenants' replicas of one file get different SSD directories.
func TestBuildSpecCarriesTheNamespace(t *testing.T) {
	dirs := map[string]string{}
	for _, ns := range []string{"team-a", "team-b"} {
		mr := &v1alpha1.ModelReplica{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m-0"},
			Spec: v1alpha1.ModelReplicaSpec{MemoryReservation: resource.MustParse("256Mi"),
				Template: v1alpha1.ModelReplicaTemplate{Engine: v1alpha1.EngineSpec{Settings: engine.Settings{ContextLength: 512, Parallel: 1}}}}}
		spec, err := clustermode.BuildSpec(t.Context(), ns+"-m-0", tinyModel, mr)
		if err != nil {
			t.Fatal(err)
		}
		if spec.Namespace != ns {
			t.Errorf("spec of a replica in %s has namespace %q", ns, spec.Namespace)
		}
		dirs[ns] = runnerproc.PromptCacheDirName(spec.Namespace, spec.Path)
	}
	if dirs["team-a"] == dirs["team-b"] || filepath.Dir(dirs["team-a"]) != "." {
		t.Errorf("prompt cache directory names %v: want one per namespace", dirs)
	}
}
