// Package chart tests the Helm chart charts/macfleet with a real helm binary: rendered
// objects, value validation, lint, and install, upgrade and uninstall on a real API
// server. helm is built from Go modules by `make helm` (bin/helm, or $MACFLEET_HELM).
package chart

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/macfleet/macfleet/test/support/testenv"
)

// helmEnv names the environment variable that `make` sets to the helm it builds.
const helmEnv = "MACFLEET_HELM"

// repoRoot is the repository root; chartDir the chart under test.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func chartDir(t *testing.T) string {
	return filepath.Join(repoRoot(t), "charts", "macfleet")
}

// helmBinary returns $MACFLEET_HELM, else <repo>/bin/helm, and fails the test saying
// how to build it when it is missing.
func helmBinary(t *testing.T) string {
	t.Helper()
	path := os.Getenv(helmEnv)
	if path == "" {
		path = filepath.Join(repoRoot(t), "bin", "helm")
	}
	if fi, err := os.Stat(path); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		t.Fatalf("no helm binary at %s: run `make helm` (`make test` builds it) or set %s", path, helmEnv)
	}
	return path
}

// helm runs the helm binary with its cache, config and data in a temporary directory
// and returns stdout, or the error with stderr in it.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.CommandContext(t.Context(), helmBinary(t), args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), errors.New("helm " + strings.Join(args, " ") + ": " + err.Error() + ": " + stderr.String())
	}
	return stdout.String(), nil
}

func mustHelm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := helm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// decodeObjects parses a multi-document YAML stream, skipping empty documents.
func decodeObjects(t *testing.T, stream []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("decoding YAML: %v", err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// key identifies an object in a rendered or source manifest.
type key struct{ Kind, Namespace, Name string }

func keyOf(o *unstructured.Unstructured) key {
	return key{o.GetKind(), o.GetNamespace(), o.GetName()}
}
