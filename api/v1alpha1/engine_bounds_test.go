package v1alpha1_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/macfleet/macfleet/api/engine"
)

// TestEngineBoundsMatchCRD: the CRDs' validation rules, defaults and enum for the
// engine settings state the bounds package engine holds as constants (the markers
// are literals, so a change to one side alone fails here).
func TestEngineBoundsMatchCRD(t *testing.T) {
	rule := func(lo, hi int) string { return fmt.Sprintf("self >= %d && self <= %d", lo, hi) }
	for _, file := range []string{"macfleet.dev_modeldeployments.yaml", "macfleet.dev_modelreplicas.yaml"} {
		t.Run(file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("..", "..", "config", "crd", "bases", file))
			if err != nil {
				t.Fatal(err)
			}
			var crd apiextensionsv1.CustomResourceDefinition
			if err := yaml.Unmarshal(b, &crd); err != nil {
				t.Fatal(err)
			}
			spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
			if file == "macfleet.dev_modelreplicas.yaml" {
				spec = spec.Properties["template"]
			}
			props := spec.Properties["engine"].Properties
			if len(props) == 0 {
				t.Fatal("the CRD has no engine properties")
			}
			check := func(field, wantRule, wantDefault string) {
				t.Helper()
				p := props[field]
				var rules []string
				for _, v := range p.XValidations {
					rules = append(rules, v.Rule)
				}
				if d := cmp.Diff([]string{wantRule}, rules); d != "" {
					t.Errorf("%s rules (-want +got):\n%s", field, d)
				}
				got := ""
				if p.Default != nil {
					got = string(p.Default.Raw)
				}
				if got != wantDefault {
					t.Errorf("%s default %q, want %q", field, got, wantDefault)
				}
			}
			check("contextLength", rule(engine.MinContextLength, engine.MaxContextLength), fmt.Sprint(engine.DefaultContextLength))
			check("parallel", rule(engine.MinParallel, engine.MaxParallel), fmt.Sprint(engine.DefaultParallel))
			check("threads", rule(0, engine.MaxThreads), "")
			check("splitPipeline", rule(engine.MinSplitPipeline, engine.MaxSplitPipeline), "")
			var enum []string
			for _, v := range props["kvCacheType"].Enum {
				enum = append(enum, string(v.Raw))
			}
			var want []string
			for _, k := range engine.KVCacheTypes {
				want = append(want, fmt.Sprintf("%q", k))
			}
			if d := cmp.Diff(want, enum); d != "" {
				t.Errorf("kvCacheType enum (-want +got):\n%s", d)
			}
			if got := string(props["kvCacheType"].Default.Raw); got != fmt.Sprintf("%q", engine.DefaultKVCacheType) {
				t.Errorf("kvCacheType default %s, want %q", got, engine.DefaultKVCacheType)
			}
		})
	}
}
