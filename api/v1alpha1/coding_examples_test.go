package v1alpha1_test

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

var (
	// appliedWithContext is a command line applying an example with a comment that
	// states its context: "kubectl apply -f docs/examples/qwen-7b.yaml   # 32k context".
	appliedWithContext = regexp.MustCompile(`docs/examples/([\w.-]+\.yaml)\s+#\s*(\d+)k context`)
	// A coding agent's settings: the model it asks for and the context window it is
	// told the deployment has.
	agentModel  = regexp.MustCompile(`(?m)^(?:export ANTHROPIC_MODEL=(\S+)|model = "([^"]+)")`)
	agentWindow = regexp.MustCompile(`(?m)^(?:export CLAUDE_CODE_MAX_CONTEXT_TOKENS=(\d+)|model_context_window = (\d+))`)
	codeBlock   = regexp.MustCompile("(?s)```[a-z]*\n(.*?)```")
)

// TestCodingExamplesContext: what README.md and docs/coding-agents.md say of the
// example deployments' contexts is what the manifests set — the context a command
// line's comment states, and the context window a coding agent's settings give for
// the deployment it asks for (a coding agent told of a larger window than the
// deployment has overflows it).
func TestCodingExamplesContext(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	deployments := readDeployments(t, filepath.Join(root, "docs", "examples"))
	checked := 0
	for _, doc := range []string{"README.md", filepath.Join("docs", "coding-agents.md")} {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range appliedWithContext.FindAllStringSubmatch(string(b), -1) {
			md, ok := deployments[m[1]]
			if !ok {
				t.Errorf("%s applies docs/examples/%s, which holds no ModelDeployment", doc, m[1])
				continue
			}
			kib, _ := strconv.Atoi(m[2])
			if got := md.Spec.Engine.ContextLength; got != int32(kib)*1024 {
				t.Errorf("%s says docs/examples/%s has %sk context; its engine.contextLength is %d", doc, m[1], m[2], got)
			}
			checked++
		}
		for _, block := range codeBlock.FindAllStringSubmatch(string(b), -1) {
			model, window := firstOf(agentModel.FindStringSubmatch(block[1])), firstOf(agentWindow.FindStringSubmatch(block[1]))
			if model == "" || window == "" {
				continue
			}
			for file, md := range deployments {
				if !serves(md, model) {
					continue
				}
				if got := strconv.Itoa(int(md.Spec.Engine.ContextLength)); got != window {
					t.Errorf("%s tells a coding agent that %s has a %s-token context; docs/examples/%s sets engine.contextLength %s",
						doc, model, window, file, got)
				}
				checked++
			}
		}
	}
	if checked < 4 {
		t.Errorf("checked %d statements of the examples' contexts; want the README's walkthrough and the coding agents' settings in both documents", checked)
	}
}

// readDeployments reads the ModelDeployments of dir's manifests, by file name.
func readDeployments(t *testing.T, dir string) map[string]mfv1.ModelDeployment {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples in %s: %v", dir, err)
	}
	out := map[string]mfv1.ModelDeployment{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(b), "\n---\n") {
			var md mfv1.ModelDeployment
			if err := yaml.Unmarshal([]byte(doc), &md); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if md.Kind == "ModelDeployment" {
				out[filepath.Base(f)] = md
			}
		}
	}
	return out
}

// serves reports whether md answers requests for the model name.
func serves(md mfv1.ModelDeployment, name string) bool {
	return md.Name == name || md.Spec.Model.ServedName == name || slices.Contains(md.Spec.Model.Aliases, name)
}

// firstOf is the first non-empty group of a match, "" for none.
func firstOf(m []string) string {
	for _, g := range m[min(len(m), 1):] {
		if g != "" {
			return g
		}
	}
	return ""
}
