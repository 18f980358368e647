package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CreateFromFile creates every object of a YAML file of the repository (a path
// relative to its root, e.g. "config/admission/source-policy.yaml"), as shipped, and
// deletes them when the test ends (cluster-scoped ones would outlive it).
func CreateFromFile(tb testing.TB, c client.Client, path string) {
	tb.Helper()
	root, err := RepoRoot()
	if err != nil {
		tb.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		tb.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return
			}
			tb.Fatalf("decoding %s: %v", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := c.Create(tb.Context(), &u); err != nil {
			tb.Fatalf("creating %s %s from %s: %v", u.GetKind(), u.GetName(), path, err)
		}
		tb.Cleanup(func() {
			if err := c.Delete(context.Background(), &u); err != nil && !apierrors.IsNotFound(err) {
				tb.Errorf("deleting %s %s: %v", u.GetKind(), u.GetName(), err)
			}
		})
	}
}

// KubectlApply runs `kubectl apply -f` (the kubectl of AssetsDir) on files or
// directories of the repository, given relative to its root, with a kubeconfig file —
// as an administrator installing them would.
func KubectlApply(ctx context.Context, kubeconfig string, paths ...string) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	assets, err := AssetsDir()
	if err != nil {
		return err
	}
	for _, p := range paths {
		out, err := exec.CommandContext(ctx, filepath.Join(assets, "kubectl"), "--kubeconfig", kubeconfig,
			"apply", "-f", filepath.Join(root, p)).CombinedOutput()
		if err != nil {
			return fmt.Errorf("kubectl apply -f %s: %w\n%s", p, err, out)
		}
	}
	return nil
}

// Apply is KubectlApply as the Env's administrator.
func (e *Env) Apply(ctx context.Context, paths ...string) error {
	f, err := os.CreateTemp("", "testenv-kubeconfig-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(e.KubeConfig)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return KubectlApply(ctx, f.Name(), paths...)
}
