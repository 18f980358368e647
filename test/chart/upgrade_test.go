package chart

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/test/support/testenv"
)

// earlierChartRev is the chart an upgrade starts from: the last commit before node
// authorization's default moved from webhook to auto, so the upgrade crosses a changed
// default, CRDs that gained fields (projector, splitPipeline, promptCache.peerWarmup
// and more) and values the old chart did not have.
const earlierChartRev = "a0b9170b341c57caf68fcb76a6d7ebb37b2614ca"

// replicaReads is rendered by node authorization mode auto (the new default) and not by
// webhook (the earlier chart's default): which of the two an upgrade rendered.
const replicaReads = "macfleet-agent-replica-reads"

// TestUpgradeFromEarlierChart installs the chart of earlierChartRev into a real API
// server, creates a ModelDeployment and a MacNode under its CRDs, and upgrades to this
// checkout's chart with the commands of docs/upgrading.md: the CRDs by server-side
// apply with --force-conflicts, then helm upgrade --reset-then-reuse-values. It checks
// that the new schema is served and matches the chart's, the objects of the first
// install are still there and read, a value given at install is kept while a changed
// default lands, and that --reuse-values (which the docs advise against) keeps the old
// chart's defaults.
func TestUpgradeFromEarlierChart(t *testing.T) {
	old := earlierChart(t, earlierChartRev)
	env := testenv.Start(t, testenv.WithCRDPaths())
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	c, ctx := env.Client, t.Context()
	ns := []string{"--kubeconfig", kubeconfig, "--namespace", installNamespace}

	mustHelm(t, append([]string{"install", "macfleet", old, "--create-namespace", "--set", "gateway.replicas=2"}, ns...)...)
	for _, o := range crdsOf(t, old) {
		waitEstablished(t, c, o.GetName())
	}
	md, node := createServedObjects(t, env)

	// --reuse-values renders the new chart with the earlier chart's values, defaults
	// included, as docs/upgrading.md says: node authorization would stay webhook, and
	// a value the earlier chart lacks is missing, which here fails the render.
	dry, err := helm(t, append([]string{"upgrade", "macfleet", chartDir(t), "--reuse-values", "--dry-run"}, ns...)...)
	switch {
	case err != nil && !strings.Contains(err.Error(), "nil pointer"):
		t.Errorf("helm upgrade --reuse-values: %v, want a render that lacks the new chart's defaults", err)
	case err != nil:
		t.Logf("helm upgrade --reuse-values fails, as docs/upgrading.md says: %v", err)
	case strings.Contains(dry, "name: "+replicaReads+"\n"):
		t.Errorf("helm upgrade --reuse-values rendered %s (mode auto): it took the new chart's defaults", replicaReads)
	}

	// Step 1 of docs/upgrading.md: the CRDs, by server-side apply. helm created them, so
	// helm owns every field; without --force-conflicts the apply is refused.
	crds := filepath.Join(chartDir(t), "crds")
	if _, err := kubectl(t, env, "apply", "--server-side", "-f", crds); err == nil || !strings.Contains(err.Error(), "conflict") {
		t.Errorf("kubectl apply --server-side without --force-conflicts over helm's CRDs: %v, want a conflict", err)
	}
	if out, err := kubectl(t, env, "apply", "--server-side", "--force-conflicts", "-f", crds); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	checkCRDsConverged(t, c, crdsOf(t, chartDir(t)))

	// Step 2: helm upgrade with the new chart's defaults and the values given before.
	mustHelm(t, append([]string{"upgrade", "macfleet", chartDir(t), "--reset-then-reuse-values"}, ns...)...)
	if !exists(t, c, "ClusterRoleBinding", "rbac.authorization.k8s.io/v1", "", replicaReads) {
		t.Errorf("after helm upgrade --reset-then-reuse-values, no ClusterRoleBinding %s: the new default (mode auto) did not land", replicaReads)
	}
	values := mustHelm(t, append([]string{"get", "values", "macfleet", "--all", "-o", "json"}, ns...)...)
	for _, want := range []string{`"replicas":2`, `"mode":"auto"`} {
		if !strings.Contains(strings.ReplaceAll(values, " ", ""), want) {
			t.Errorf("the upgraded release's values lack %s:\n%s", want, values)
		}
	}

	checkSurvived(t, env, md, node)
	// The new chart's fields are served on the objects made under the old schema.
	patch := []byte(`{"spec":{"engine":{"promptCache":{"peerWarmup":true}}}}`)
	if err := c.Patch(ctx, md, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatal(err)
	}
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(md.GroupVersionKind())
	if err := c.Get(ctx, client.ObjectKeyFromObject(md), got); err != nil {
		t.Fatal(err)
	}
	if v, _, _ := unstructured.NestedBool(got.Object, "spec", "engine", "promptCache", "peerWarmup"); !v {
		t.Errorf("spec.engine.promptCache.peerWarmup was pruned after the upgrade: the new schema is not served\n%v", got.Object["spec"])
	}
}

// earlierChart writes the chart of rev into a temporary directory and returns it. A
// checkout without that commit (a shallow clone, a source archive) skips the test.
func earlierChart(t *testing.T, rev string) string {
	t.Helper()
	root := repoRoot(t)
	if err := exec.Command("git", "-C", root, "cat-file", "-e", rev+"^{commit}").Run(); err != nil {
		t.Skipf("this checkout lacks commit %s, the chart the upgrade starts from (a shallow clone or no git history: "+
			"git fetch --unshallow): %v", rev, err)
	}
	cmd := exec.Command("git", "-C", root, "archive", "--format=tar", rev, "charts/macfleet")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	archive, err := cmd.Output()
	if err != nil {
		t.Fatalf("git archive %s charts/macfleet: %v: %s", rev, err, stderr.String())
	}
	dir := t.TempDir()
	r := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		path := filepath.Join(dir, filepath.FromSlash(h.Name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "charts", "macfleet")
}

// crdsOf reads the CustomResourceDefinitions of a chart's crds/ folder.
func crdsOf(t *testing.T, chart string) []*apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chart, "crds", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s: %v", chart, err)
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(data, crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		crds = append(crds, crd)
	}
	return crds
}

// checkCRDsConverged fails unless every CRD on the server has the chart's schema for
// each version and is established.
func checkCRDsConverged(t *testing.T, c client.Client, want []*apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	for _, w := range want {
		waitEstablished(t, c, w.Name)
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("apiextensions.k8s.io/v1")
		u.SetKind("CustomResourceDefinition")
		if err := c.Get(t.Context(), client.ObjectKey{Name: w.Name}, u); err != nil {
			t.Fatal(err)
		}
		got := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, got); err != nil {
			t.Fatal(err)
		}
		if len(got.Spec.Versions) != len(w.Spec.Versions) {
			t.Errorf("CRD %s serves %d versions, the chart has %d", w.Name, len(got.Spec.Versions), len(w.Spec.Versions))
			continue
		}
		for i, v := range w.Spec.Versions {
			if !equality.Semantic.DeepEqual(got.Spec.Versions[i].Schema, v.Schema) {
				t.Errorf("CRD %s version %s: the served schema is not the chart's after the upgrade", w.Name, v.Name)
			}
		}
	}
}

func exists(t *testing.T, c client.Client, kind, apiVersion, namespace, name string) bool {
	t.Helper()
	o := &unstructured.Unstructured{}
	o.SetAPIVersion(apiVersion)
	o.SetKind(kind)
	err := c.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: name}, o)
	return err == nil
}

// kubectl runs the kubectl next to the test's kube-apiserver against env.
func kubectl(t *testing.T, env *testenv.Env, args ...string) (string, error) {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	bin := filepath.Join(assets, "kubectl")
	if _, err := os.Stat(bin); assets == "" || err != nil {
		t.Fatalf("no kubectl in KUBEBUILDER_ASSETS (%q): `make test` sets it (hack/envtest)", assets)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), errors.New("kubectl " + strings.Join(args, " ") + ": " + err.Error() + ": " + out.String())
	}
	return out.String(), nil
}

// upgradeTeam is the namespace of the ModelDeployment made before the upgrade.
const upgradeTeam = "team-upgrade"

// createServedObjects creates, under the earlier chart's CRDs, what a served model
// starts from: a ModelDeployment and the MacNode of a Mac.
func createServedObjects(t *testing.T, env *testenv.Env) (md, node *unstructured.Unstructured) {
	t.Helper()
	ctx := t.Context()
	ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": upgradeTeam}}}
	md = &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "macfleet.dev/v1alpha1", "kind": "ModelDeployment",
		"metadata": map[string]any{"name": "tiny-chat", "namespace": upgradeTeam},
		"spec": map[string]any{
			"model":     map[string]any{"source": "hf://macfleet/tiny/tiny-chat.gguf", "aliases": []any{"chat"}},
			"engine":    map[string]any{"contextLength": int64(1024), "parallel": int64(2)},
			"replicas":  int64(2),
			"placement": map[string]any{"strategy": "Spread"},
		},
	}}
	node = &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "macfleet.dev/v1alpha1", "kind": "MacNode",
		"metadata": map[string]any{"name": "mac-1"},
		"spec":     map[string]any{"unschedulable": false},
	}}
	for _, o := range []*unstructured.Unstructured{ns, md, node} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatalf("creating %s under the earlier chart: %v", describe(o), err)
		}
	}
	return md, node
}

// checkSurvived fails unless the objects made before the upgrade are the same objects
// (uid) with the same spec, and the chart's own SourcePolicy is still there.
func checkSurvived(t *testing.T, env *testenv.Env, before ...*unstructured.Unstructured) {
	t.Helper()
	for _, b := range before {
		got := newEmpty(b)
		if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(b), got); err != nil {
			t.Errorf("after the upgrade, %s: %v", describe(b), err)
			continue
		}
		if got.GetUID() != b.GetUID() {
			t.Errorf("after the upgrade, %s is another object (uid %s, was %s)", describe(b), got.GetUID(), b.GetUID())
		}
		if !equality.Semantic.DeepEqual(got.Object["spec"], b.Object["spec"]) {
			t.Errorf("after the upgrade, %s's spec changed:\n%v\nwas\n%v", describe(b), got.Object["spec"], b.Object["spec"])
		}
	}
	if !exists(t, env.Client, "SourcePolicy", "macfleet.dev/v1alpha1", "", "default") {
		t.Error("after the upgrade, the chart's SourcePolicy default is gone")
	}
}
