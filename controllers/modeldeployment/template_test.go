package modeldeployment

import (
	"regexp"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
)

func deployment(mutate func(*v1alpha1.ModelDeployment)) *v1alpha1.ModelDeployment {
	md := &v1alpha1.ModelDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: "qwen", Namespace: "team-a"},
		Spec: v1alpha1.ModelDeploymentSpec{
			Model: v1alpha1.ModelSource{Source: "hf://Qwen/Qwen2.5-GGUF/q4.gguf"},
		},
	}
	if mutate != nil {
		mutate(md)
	}
	return md
}

func TestTemplateHash(t *testing.T) {
	base := templateHash(replicaTemplate(deployment(nil)))
	if !regexp.MustCompile(`^[0-9a-f]{10}$`).MatchString(base) {
		t.Fatalf("hash %q is not 10 hex digits", base)
	}

	same := map[string]func(*v1alpha1.ModelDeployment){
		"explicit defaults": func(md *v1alpha1.ModelDeployment) {
			md.Spec.Engine = v1alpha1.EngineSpec{Settings: engine.Settings{ContextLength: 4096, Parallel: 1, KVCacheType: v1alpha1.KVCacheF16}}
			md.Spec.Residency = v1alpha1.ResidencyResident
			md.Spec.Model.ServedName = "qwen"
		},
		"replicas":  func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To[int32](7) },
		"placement": func(md *v1alpha1.ModelDeployment) { md.Spec.Placement.Strategy = v1alpha1.Spread },
		"labels":    func(md *v1alpha1.ModelDeployment) { md.Labels = map[string]string{"a": "b"} },
		"empty aliases": func(md *v1alpha1.ModelDeployment) {
			md.Spec.Model.Aliases = []string{}
		},
		"resources": func(md *v1alpha1.ModelDeployment) {
			// The reservation is not part of the template (see isCurrent).
			md.Spec.Resources = &v1alpha1.ModelResources{}
		},
		"peer warm-up (the gateway's setting)": func(md *v1alpha1.ModelDeployment) {
			md.Spec.Engine.PromptCache = &v1alpha1.PromptCacheSpec{PeerWarmup: ptr.To(true)}
		},
	}
	for name, m := range same {
		if got := templateHash(replicaTemplate(deployment(m))); got != base {
			t.Errorf("%s: hash %s, want %s", name, got, base)
		}
	}

	a := templateHash(replicaTemplate(deployment(func(md *v1alpha1.ModelDeployment) { md.Spec.Model.Aliases = []string{"x", "y"} })))
	b := templateHash(replicaTemplate(deployment(func(md *v1alpha1.ModelDeployment) { md.Spec.Model.Aliases = []string{"y", "x", "x"} })))
	if a != b {
		t.Errorf("aliases in another order hash differently: %s vs %s", a, b)
	}
	d1 := templateHash(replicaTemplate(deployment(func(md *v1alpha1.ModelDeployment) {
		md.Spec.Residency = v1alpha1.ResidencyOnDemand
		md.Spec.IdleTimeout = &metav1.Duration{Duration: time.Minute}
	})))
	d2 := templateHash(replicaTemplate(deployment(func(md *v1alpha1.ModelDeployment) {
		md.Spec.Residency = v1alpha1.ResidencyOnDemand
		md.Spec.IdleTimeout = &metav1.Duration{Duration: 60 * time.Second}
	})))
	if d1 != d2 {
		t.Errorf("equal idle timeouts hash differently: %s vs %s", d1, d2)
	}
	w1 := templateHash(replicaTemplate(deployment(func(md *v1alpha1.ModelDeployment) {
		md.Spec.Engine.PromptCache = &v1alpha1.PromptCacheSpec{Enabled: ptr.To(true), PeerWarmup: ptr.To(true)}
	})))
	w2 := templateHash(replicaTemplate(deployment(func(md *v1alpha1.ModelDeployment) {
		md.Spec.Engine.PromptCache = &v1alpha1.PromptCacheSpec{Enabled: ptr.To(true), PeerWarmup: ptr.To(false)}
	})))
	if w1 != w2 {
		t.Errorf("turning peer warm-up on rolls the replicas: %s vs %s", w1, w2)
	}

	differ := map[string]func(*v1alpha1.ModelDeployment){
		"source":      func(md *v1alpha1.ModelDeployment) { md.Spec.Model.Source = "hf://Qwen/Qwen2.5-GGUF/q8.gguf" },
		"sha256":      func(md *v1alpha1.ModelDeployment) { md.Spec.Model.SHA256 = "ab" },
		"servedName":  func(md *v1alpha1.ModelDeployment) { md.Spec.Model.ServedName = "other" },
		"aliases":     func(md *v1alpha1.ModelDeployment) { md.Spec.Model.Aliases = []string{"q"} },
		"context":     func(md *v1alpha1.ModelDeployment) { md.Spec.Engine.ContextLength = 8192 },
		"parallel":    func(md *v1alpha1.ModelDeployment) { md.Spec.Engine.Parallel = 4 },
		"kv type":     func(md *v1alpha1.ModelDeployment) { md.Spec.Engine.KVCacheType = v1alpha1.KVCacheQ8_0 },
		"residency":   func(md *v1alpha1.ModelDeployment) { md.Spec.Residency = v1alpha1.ResidencyPinned },
		"idleTimeout": func(md *v1alpha1.ModelDeployment) { md.Spec.IdleTimeout = &metav1.Duration{Duration: time.Minute} },
		"name (served name default)": func(md *v1alpha1.ModelDeployment) {
			md.Name = "renamed"
		},
	}
	seen := map[string]string{base: "base"}
	for name, m := range differ {
		h := templateHash(replicaTemplate(deployment(m)))
		if prev, dup := seen[h]; dup {
			t.Errorf("%s: hash %s equals that of %s", name, h, prev)
		}
		seen[h] = name
	}
}

func TestReplicaTemplateDefaults(t *testing.T) {
	tmpl := replicaTemplate(deployment(nil))
	if tmpl.Model.ServedName != "qwen" || tmpl.Engine.ContextLength != 4096 || tmpl.Engine.Parallel != 1 ||
		tmpl.Engine.KVCacheType != v1alpha1.KVCacheF16 || tmpl.Residency != v1alpha1.ResidencyResident {
		t.Errorf("defaults not applied: %+v", tmpl)
	}
	md := deployment(func(md *v1alpha1.ModelDeployment) { md.Spec.Model.Aliases = []string{"b", "a"} })
	_ = replicaTemplate(md)
	if md.Spec.Model.Aliases[0] != "b" {
		t.Error("replicaTemplate sorted the deployment's own aliases")
	}
}
