package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/internal/modelfit"
	"github.com/macfleet/macfleet/test/support/testenv"
)

const (
	coderHubPath = "/org/coder-GGUF/resolve/main/coder.gguf"
	coderModel   = "hf://org/coder-GGUF/coder.gguf"
)

// coderHub writes an 8B-shaped model trained at 40k context as a sparse file whose
// weights are never written (what `models fit` reads of it is the header) and serves
// it from a hub double that wants token; it returns the file's path and the hub.
func coderHub(t *testing.T, token string) (string, *hubDouble) {
	t.Helper()
	spec := ggufsynth.EightB(ggufsynth.Q4_0)
	spec.Ctx = 40960
	p := filepath.Join(t.TempDir(), "coder.gguf")
	if err := ggufsynth.WriteHeader(p, spec); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return p, newHubDoubleAt(t, coderHubPath, token, f, fi.Size())
}

// runFit runs `macfleet models fit` with args and returns its output.
func runFit(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return runCommand(t, modelsFitCmd(), args...)
}

// fitJSON runs `macfleet models fit` with args and --json, and returns its report.
func fitJSON(t *testing.T, args ...string) modelfit.Report {
	t.Helper()
	out, err := runFit(t, append(args, "--json")...)
	if err != nil {
		t.Fatalf("models fit %q: %v\n%s", args, err, out)
	}
	var rep modelfit.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("models fit %q: %v\n%s", args, err, out)
	}
	return rep
}

// needsOf is the estimate of the model at path at each context, as the manager
// would make it for a deployment of that context.
func needsOf(t *testing.T, path string, contexts ...int64) map[int64]int64 {
	t.Helper()
	out := map[int64]int64{}
	for _, c := range contexts {
		r, err := estimate.Estimate(t.Context(), estimate.Params{Path: path, ContextLength: int32(c), Parallel: 1})
		if err != nil {
			t.Fatal(err)
		}
		out[c] = r.Total
	}
	return out
}

// TestModelsFitFleet: `macfleet models fit hf://…` reads the header from the hub (a
// double on loopback, with the token) by range requests, and tells of each MacNode
// of a real API server the largest context that fits now and once freed, by the
// MacNodes' ceilings, committed and agent memory; the fleet's SourcePolicy decides
// which sources may be read when no --source-policy is given.
func TestModelsFitFleet(t *testing.T) {
	env := testenv.Start(t, testenv.WithScheme(v1alpha1.AddToScheme))
	t.Setenv("HOME", t.TempDir())
	path, hub := coderHub(t, "hf_gated")
	t.Setenv(hfTokenEnv, "hf_gated")
	need := needsOf(t, path, 4096, 8192, 16384, 32768, 40960)

	const agent = 256 << 20
	gi := func(v int64) *resource.Quantity { return resource.NewQuantity(v, resource.BinarySI) }
	for _, m := range []struct {
		name               string
		ceiling, committed int64
		cordoned           bool
	}{
		{"roomy", need[40960] + agent + 1<<30, 0, false},
		{"small", (need[8192]+need[16384])/2 + agent, 0, false},
		{"busy", need[40960] + agent + 1<<30, need[40960] + 1<<30 - need[4096], true},
	} {
		mn := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: m.name}, Spec: v1alpha1.MacNodeSpec{Unschedulable: m.cordoned}}
		if err := env.Client.Create(t.Context(), mn); err != nil {
			t.Fatal(err)
		}
		mn.Status = v1alpha1.MacNodeStatus{Hardware: v1alpha1.HardwareStatus{UnifiedMemory: gi(64 << 30)},
			Memory: v1alpha1.NodeMemoryStatus{Ceiling: gi(m.ceiling), Committed: gi(m.committed), Agent: gi(agent)},
			Conditions: []metav1.Condition{{Type: v1alpha1.MacNodeReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentReady,
				LastTransitionTime: metav1.Now()}}}
		if err := env.Client.Status().Update(t.Context(), mn); err != nil {
			t.Fatal(err)
		}
	}
	kc := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := os.WriteFile(kc, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}

	out, err := runFit(t, coderModel, "--kubeconfig", kc, "-n", serveNamespace, "--hf-endpoint", hub.URL, "--source-policy", loopbackPolicy(t), "--json")
	if err != nil {
		t.Fatalf("models fit: %v\n%s", err, out)
	}
	var rep modelfit.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	if rep.Model.TrainedContext != 40960 || len(rep.Needs) != 5 {
		t.Fatalf("model %+v, needs %+v: want trained context 40960 and the ladder 4k, 8k, 16k, 32k, 40k", rep.Model, rep.Needs)
	}
	for _, n := range rep.Needs {
		if n.Bytes != need[n.Context] {
			t.Errorf("need at %d: %d bytes, the estimate of the file itself says %d", n.Context, n.Bytes, need[n.Context])
		}
	}
	got := map[string][2]int64{}
	for _, f := range rep.Macs {
		got[f.Mac.Name] = [2]int64{f.MaxContext, f.MaxContextFreed}
		if f.Mac.Name == "busy" && (f.Free != need[4096] || f.Capacity != need[40960]+1<<30 || f.Mac.Unavailable != "cordoned") {
			t.Errorf("busy offers %d free of %d (%q); want %d of %d, cordoned", f.Free, f.Capacity, f.Mac.Unavailable, need[4096], need[40960]+1<<30)
		}
	}
	want := map[string][2]int64{"roomy": {40960, 40960}, "small": {8192, 8192}, "busy": {4096, 40960}}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: largest context now and once freed %v, want %v", name, got[name], w)
		}
	}
	for _, r := range hub.requests() {
		if !strings.HasPrefix(r, "GET "+coderHubPath+" ") || !strings.HasSuffix(r, "Bearer hf_gated") {
			t.Errorf("the hub saw %q; want GETs of %s with the token", r, coderHubPath)
		}
	}

	// Without --source-policy the fleet's rules apply: none (the default) refuses the
	// loopback hub; a SourcePolicy allowing it for the kubeconfig's namespace lets the
	// same question through, as a table.
	if _, err := runFit(t, coderModel, "--kubeconfig", kc, "--hf-endpoint", hub.URL); err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("the fleet without a SourcePolicy: %v, want the loopback hub refused", err)
	}
	sp := &v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SourcePolicyName},
		Spec: v1alpha1.SourcePolicySpec{Rules: []v1alpha1.SourcePolicyRule{{Namespaces: []string{"default"}, Registries: []v1alpha1.SourceRegistry{v1alpha1.RegistryHF}}},
			AllowedNetworks: []string{"127.0.0.0/8"}}}
	if err := env.Client.Create(t.Context(), sp); err != nil {
		t.Fatal(err)
	}
	out, err = runFit(t, coderModel, "--kubeconfig", kc, "--hf-endpoint", hub.URL, "--context-length", "16384")
	if err != nil {
		t.Fatalf("models fit under the fleet's SourcePolicy: %v\n%s", err, out)
	}
	for _, w := range []string{"the 3 MacNodes of the cluster at", "trained context 40k", "\n16k ",
		"small: too small at every context asked", "busy: not now; up to 16k context once its models", "cordoned"} {
		if !strings.Contains(out, w) {
			t.Errorf("the table lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "\n4k ") {
		t.Errorf("--context-length 16384 printed other contexts:\n%s", out)
	}
}

// TestModelsFitOneMac: without a cluster, `models fit` answers for one Mac of
// --memory, or this machine; the errors say what is wrong and what to do.
func TestModelsFitOneMac(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBECONFIG", "")
	path, hub := coderHub(t, "hf_gated")
	notGGUF := newHubDouble(t, coderHubPath, "hf_gated", []byte("<html>please log in</html>"+strings.Repeat(" ", 4096)))
	policy := loopbackPolicy(t)
	t.Setenv(hfTokenEnv, "hf_gated")

	out, err := runFit(t, path, "--memory", "24Gi")
	if err != nil {
		t.Fatalf("a local file on a 24Gi Mac: %v\n%s", err, out)
	}
	for _, w := range []string{"one Mac of 24Gi at the agent's default ceiling", "mac-24gi (", "\n40k "} {
		if !strings.Contains(out, w) {
			t.Errorf("the table lacks %q:\n%s", w, out)
		}
	}
	out, err = runFit(t, "file://"+path, "--context-length", "8192", "--json")
	if err != nil || !strings.Contains(out, `"where": "this machine, its ceiling as 'macfleet doctor' computes it (no kubeconfig found`) {
		t.Errorf("no kubeconfig: %v, want this machine's answer:\n%s", err, out)
	}

	for _, tc := range []struct {
		name string
		args []string
		env  string
		want string
	}{
		{"not a GGUF", []string{coderModel, "--memory", "24Gi", "--hf-endpoint", notGGUF.URL, "--source-policy", policy}, "hf_gated", "is not a GGUF file"},
		{"the default policy refuses the loopback hub", []string{coderModel, "--memory", "24Gi", "--hf-endpoint", hub.URL}, "hf_gated", "loopback"},
		{"a gated model without a token", []string{coderModel, "--memory", "24Gi", "--hf-endpoint", hub.URL, "--source-policy", policy}, "", "--hf-token or $HF_TOKEN"},
		{"a later part of a model stored in parts", []string{"hf://org/coder-GGUF/coder-00002-of-00003.gguf", "--memory", "24Gi"}, "hf_gated",
			"name its first part, hf://org/coder-GGUF/coder-00001-of-00003.gguf"},
		{"a later local part of a model stored in parts", []string{filepath.Join(filepath.Dir(path), "coder-00002-of-00003.gguf"), "--memory", "24Gi"}, "hf_gated",
			"name its first part, file://" + filepath.Join(filepath.Dir(path), "coder-00001-of-00003.gguf")},
		{"a ceiling without a Mac", []string{path, "--memory-ceiling", "12Gi"}, "hf_gated", "add --memory SIZE or --local"},
		{"a bad size", []string{path, "--memory", "lots"}, "hf_gated", `--memory "lots": want the Mac's unified memory`},
		{"a bad KV cache type", []string{path, "--memory", "24Gi", "--kv-cache-type", "q2"}, "hf_gated", `unknown KV cache type "q2"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(hfTokenEnv, tc.env)
			out, err := runFit(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("models fit %q: %v, want an error containing %q\n%s", tc.args, err, tc.want, out)
			}
		})
	}
}

// TestModelsFitOllama: an ollama:// source is read from the blob its registry's
// manifest names, by range requests, under a policy that lets the namespace use the
// registry; the policy's rules, not the registry, refuse a namespace they do not name.
func TestModelsFitOllama(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBECONFIG", "")
	path, _ := coderHub(t, "unused")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	var ranges atomic.Int32
	reg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v2/library/coder/manifests/7b":
			fmt.Fprintf(w, `{"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":%q,"size":%d}]}`, digest, fi.Size())
		case "/v2/library/coder/blobs/" + digest:
			if r.Header.Get("Range") == "" {
				http.Error(w, "a whole download: want range requests", http.StatusTeapot)
				return
			}
			ranges.Add(1)
			http.ServeContent(w, r, "", time.Time{}, io.NewSectionReader(f, 0, fi.Size()))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(reg.Close)
	policy := loopbackPolicyFor(t, "ollama")

	out, err := runFit(t, "ollama://coder:7b", "--memory", "32Gi", "--ollama-registry", reg.URL, "--source-policy", policy, "--json")
	if err != nil {
		t.Fatalf("models fit ollama://: %v\n%s", err, out)
	}
	var rep modelfit.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	need := needsOf(t, path, 40960)
	if last := rep.Needs[len(rep.Needs)-1]; last.Context != 40960 || last.Bytes != need[40960] || rep.Model.FileSize != fi.Size() {
		t.Errorf("needs %+v, file size %d: want 40k last at %d bytes, a file of %d", rep.Needs, rep.Model.FileSize, need[40960], fi.Size())
	}
	if ranges.Load() == 0 {
		t.Error("the registry served no range of the blob")
	}
	if _, err := runFit(t, "ollama://coder:7b", "-n", "team-a", "--memory", "32Gi", "--ollama-registry", reg.URL, "--source-policy", policy); err == nil ||
		!strings.Contains(err.Error(), `namespace "team-a"`) {
		t.Errorf("a namespace the policy does not name: %v, want it refused", err)
	}
}

// TestModelsFitParts: `models fit` of a model stored in three parts, named by its
// first part on the hub (by range requests, with the token) or on the disk, counts
// every part: the same weights and needs as the model in one file, up to its two
// more headers.
func TestModelsFitParts(t *testing.T) {
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBECONFIG", "")
	t.Setenv(hfTokenEnv, "hf_gated")
	spec := ggufsynth.EightB(ggufsynth.Q4_0)
	dir := t.TempDir()
	one := filepath.Join(dir, "coder.gguf")
	if err := ggufsynth.WriteHeader(one, spec); err != nil {
		t.Fatal(err)
	}
	parts, err := ggufsynth.WritePartHeaders(filepath.Join(dir, "coder"), spec, 3)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, p := range parts {
		files["/org/coder-GGUF/resolve/main/"+filepath.Base(p)] = p
	}
	hub := newHubDoubleFiles(t, "hf_gated", files)

	fit := func(args ...string) modelfit.Report {
		t.Helper()
		return fitJSON(t, append(args, "--memory", "24Gi", "--context-length", "8192")...)
	}
	whole := fit(one)
	for _, args := range [][]string{
		{parts[0]},
		{"hf://org/coder-GGUF/coder-00001-of-00003.gguf", "--hf-endpoint", hub.URL, "--source-policy", loopbackPolicy(t)},
	} {
		got := fit(args...)
		var size int64
		for _, p := range parts {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			size += fi.Size()
		}
		if got.Model.Weights != whole.Model.Weights || got.Model.Parameters != whole.Model.Parameters || got.Model.FileSize != size {
			t.Errorf("models fit %s: %+v; want the one file's weights and parameters %+v and the parts' size %d", args[0], got.Model, whole.Model, size)
		}
		if len(got.Needs) != 1 || len(whole.Needs) != 1 {
			t.Fatalf("needs %+v and %+v, want one context each", got.Needs, whole.Needs)
		}
		if d := got.Needs[0].Bytes - whole.Needs[0].Bytes; d < 0 || d > 1<<20 {
			t.Errorf("models fit %s needs %d bytes, the one file %d", args[0], got.Needs[0].Bytes, whole.Needs[0].Bytes)
		}
	}
}
