package v1alpha1_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// exampleObject is what the scaling examples test reads of a manifest.
type exampleObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		ScaleTargetRef struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Name       string `json:"name"`
		} `json:"scaleTargetRef"`
		Autoscaling *json.RawMessage `json:"autoscaling"`
		Metrics     []struct {
			Type   string `json:"type"`
			Object *struct {
				DescribedObject struct {
					Kind string `json:"kind"`
					Name string `json:"name"`
				} `json:"describedObject"`
				Metric struct {
					Name string `json:"name"`
				} `json:"metric"`
				Target struct {
					Type string `json:"type"`
				} `json:"target"`
			} `json:"object"`
		} `json:"metrics"`
		Triggers []struct {
			Type     string            `json:"type"`
			Metadata map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

func readExamples(t *testing.T, dir string) map[string]exampleObject {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples in %s: %v", dir, err)
	}
	out := map[string]exampleObject{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var o exampleObject
		if err := yaml.Unmarshal(b, &o); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[filepath.Base(f)] = o
	}
	return out
}

// TestScalingExamples checks the HPA and KEDA examples docs/autoscaling.md points to:
// each drives, through the scale subresource, a ModelDeployment example that has no
// spec.autoscaling (two writers of spec.replicas would fight); the HPA divides an
// Object metric of the deployment by the replicas (AverageValue: a replica is not a
// Pod); KEDA's query sums the gateway metric that exists, for the deployment it
// scales. The HPA itself is applied to the API server by TestSamplesApplyAndPrint;
// here the example deployment's scale subresource is read and written as the HPA
// controller would.
func TestScalingExamples(t *testing.T) {
	root, kubectl := kubectlFor(t)
	examples := readExamples(t, filepath.Join(root, "docs", "examples"))
	keda := readExamples(t, filepath.Join(root, "docs", "examples", "keda"))
	deployments := map[string]exampleObject{}
	for _, o := range examples {
		if o.Kind == "ModelDeployment" {
			deployments[o.Metadata.Name] = o
		}
	}
	gatewayMetrics, err := os.ReadFile(filepath.Join(root, "gateway", "metrics.go"))
	if err != nil {
		t.Fatal(err)
	}

	checkTarget := func(file string, o exampleObject) {
		t.Helper()
		ref := o.Spec.ScaleTargetRef
		if ref.APIVersion != mfv1.GroupVersion.String() || ref.Kind != "ModelDeployment" {
			t.Errorf("%s: scaleTargetRef %s %s, want %s ModelDeployment", file, ref.APIVersion, ref.Kind, mfv1.GroupVersion)
		}
		md, ok := deployments[ref.Name]
		if !ok {
			t.Errorf("%s: scales %q, which no example in docs/examples defines", file, ref.Name)
		} else if md.Spec.Autoscaling != nil {
			t.Errorf("%s: scales %q, which has spec.autoscaling: the autoscaler and %s would both write spec.replicas", file, ref.Name, o.Kind)
		}
	}
	var hpas, scaledObjects []string
	for file, o := range examples {
		if o.Kind != "HorizontalPodAutoscaler" {
			continue
		}
		hpas = append(hpas, file)
		checkTarget(file, o)
		if len(o.Spec.Metrics) == 0 {
			t.Errorf("%s: no metrics", file)
		}
		for _, m := range o.Spec.Metrics {
			if m.Type != "Object" || m.Object == nil || m.Object.DescribedObject.Kind != "ModelDeployment" ||
				m.Object.DescribedObject.Name != o.Spec.ScaleTargetRef.Name || m.Object.Target.Type != "AverageValue" {
				t.Errorf("%s: metric %s %+v, want an Object metric of the deployment it scales with an AverageValue target", file, m.Type, m.Object)
			}
		}
	}
	for file, o := range keda {
		if o.Kind != "ScaledObject" {
			continue
		}
		scaledObjects = append(scaledObjects, file)
		checkTarget(file, o)
		for _, tr := range o.Spec.Triggers {
			want := fmt.Sprintf(`macfleet_gateway_inflight{model="%s/%s"}`, o.Metadata.Namespace, o.Spec.ScaleTargetRef.Name)
			if tr.Type != "prometheus" || !strings.Contains(tr.Metadata["query"], want) || tr.Metadata["threshold"] == "" {
				t.Errorf("%s: trigger %+v, want a prometheus query on %s with a threshold", file, tr, want)
			}
		}
	}
	if len(hpas) == 0 || len(scaledObjects) == 0 {
		t.Fatalf("examples: %d HPAs in docs/examples, %d ScaledObjects in docs/examples/keda; want one of each", len(hpas), len(scaledObjects))
	}
	if !strings.Contains(string(gatewayMetrics), `Name: "macfleet_gateway_inflight"`) {
		t.Errorf("gateway/metrics.go no longer defines macfleet_gateway_inflight, which the KEDA example and docs/autoscaling.md query")
	}

	// The scale subresource, as the HPA controller (and KEDA's HPA) uses it: read
	// replicas, write replicas. (Its selector, status.selector, is the modeldeployment
	// controller's and tested there.)
	ns := testenv.NewNamespace(t, env.Client)
	kubectl("apply", "-n", ns, "-f", filepath.Join(root, "docs", "examples", "qwen-7b.yaml"))
	scalePath := fmt.Sprintf("/apis/%s/namespaces/%s/modeldeployments/qwen-7b/scale", mfv1.GroupVersion, ns)
	var scale struct {
		Spec struct {
			Replicas int32 `json:"replicas"`
		} `json:"spec"`
	}
	if err := json.Unmarshal([]byte(kubectl("get", "--raw", scalePath)), &scale); err != nil {
		t.Fatal(err)
	}
	if scale.Spec.Replicas != 2 {
		t.Errorf("scale of the example: %d replicas, want its spec.replicas 2", scale.Spec.Replicas)
	}
	kubectl("scale", "-n", ns, "modeldeployment/qwen-7b", "--replicas", "3")
	if out := kubectl("get", "-n", ns, "modeldeployment/qwen-7b", "-o", "jsonpath={.spec.replicas}"); out != "3" {
		t.Errorf("spec.replicas after scaling through the subresource = %q, want 3", out)
	}
}
