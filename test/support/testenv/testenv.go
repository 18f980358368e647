// Package testenv starts a real kube-apiserver and etcd (controller-runtime's envtest)
// for the envtest suites, with the CRDs from config/crd/bases installed, and provides
// the per-test helpers those suites share: a fresh namespace per test and a polling
// Eventually with an explicit deadline.
//
// The binaries come from KUBEBUILDER_ASSETS, which `make test` points at the cache that
// `make envtest` fills. A package runs one API server for all its tests:
//
//	var env *testenv.Env
//
//	func TestMain(m *testing.M) {
//		testenv.Main(m, &env, testenv.WithScheme(v1alpha1.AddToScheme))
//	}
//
// Starting takes about 4 s. The API server delays any create of a custom resource by
// 2 s while its CRD has been Established for less than 2 s (a guard for HA servers),
// so the first create of each kind right after the start is slow; later ones are not.
package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// AssetsEnv names the environment variable holding the directory with kube-apiserver,
// etcd and kubectl.
const AssetsEnv = "KUBEBUILDER_ASSETS"

// binaries are the executables envtest runs from the assets directory.
var binaries = []string{"kube-apiserver", "etcd", "kubectl"}

// Env is a running API server with a client for it.
type Env struct {
	// Config reaches the API server as a member of system:masters.
	Config *rest.Config
	// Client is an uncached controller-runtime client using Scheme.
	Client client.Client
	// Scheme holds the client-go types plus those added with WithScheme.
	Scheme *runtime.Scheme
	// KubeConfig is a kubeconfig file's content for Config.
	KubeConfig []byte
	// CRDPaths are the directories or files the CRDs were installed from.
	CRDPaths []string

	env *envtest.Environment
}

type options struct {
	schemes     []func(*runtime.Scheme) error
	crdPaths    []string
	crdsSet     bool
	authzConfig string
}

// Option configures New, Start and Main.
type Option func(*options)

// WithScheme adds types to the scheme of Env.Client, e.g. v1alpha1.AddToScheme. The
// client-go types are always present.
func WithScheme(addToScheme ...func(*runtime.Scheme) error) Option {
	return func(o *options) { o.schemes = append(o.schemes, addToScheme...) }
}

// WithCRDPaths installs the CRDs from these directories or files (relative to the
// working directory, which for a test is its package directory) instead of
// <repo>/config/crd/bases. Every path must exist. With no paths, no CRDs are installed.
func WithCRDPaths(paths ...string) Option {
	return func(o *options) { o.crdPaths, o.crdsSet = paths, true }
}

// WithAuthorizationConfig starts the API server with --authorization-config=path (a
// structured AuthorizationConfiguration) instead of --authorization-mode=RBAC.
func WithAuthorizationConfig(path string) Option {
	return func(o *options) { o.authzConfig = path }
}

// New starts an API server. The caller must call Stop.
func New(opts ...Option) (*Env, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}

	s := runtime.NewScheme()
	for _, add := range append([]func(*runtime.Scheme) error{clientgoscheme.AddToScheme}, o.schemes...) {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("building the scheme: %w", err)
		}
	}

	crdPaths := o.crdPaths
	if !o.crdsSet {
		root, err := RepoRoot()
		if err != nil {
			return nil, err
		}
		crdPaths = []string{filepath.Join(root, "config", "crd", "bases")}
	}
	for _, p := range crdPaths {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("no CRDs at %s (run `make manifests`): %w", p, err)
		}
	}

	assets, err := AssetsDir()
	if err != nil {
		return nil, err
	}

	te := &envtest.Environment{
		Scheme:                s,
		CRDDirectoryPaths:     crdPaths,
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: assets,
	}
	te.ControlPlane.GetAPIServer().Path = filepath.Join(assets, "kube-apiserver")
	te.ControlPlane.KubectlPath = filepath.Join(assets, "kubectl")
	if o.authzConfig != "" {
		te.ControlPlane.GetAPIServer().Configure().Disable("authorization-mode").Set("authorization-config", o.authzConfig)
	}
	cfg, err := te.Start()
	if err != nil {
		// A partly started control plane still has processes and temp dirs to remove.
		return nil, errors.Join(fmt.Errorf("starting kube-apiserver and etcd from %s: %w", assets, err), te.Stop())
	}
	c, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("creating a client: %w", err), te.Stop())
	}
	return &Env{Config: cfg, Client: c, Scheme: s, KubeConfig: te.KubeConfig, CRDPaths: crdPaths, env: te}, nil
}

// ServiceAccountSigningKey is the PEM file of the key the API server signs service
// account tokens with, for a test that makes a token the API server would have issued
// at another time (one that expired).
func (e *Env) ServiceAccountSigningKey() string {
	return filepath.Join(e.env.ControlPlane.GetAPIServer().CertDir, "sa-signer.key")
}

// Stop stops the API server and etcd and removes their data.
func (e *Env) Stop() error {
	if err := e.env.Stop(); err != nil {
		return fmt.Errorf("stopping kube-apiserver and etcd: %w", err)
	}
	return nil
}

// Start starts an API server for one test and stops it when the test ends.
func Start(tb testing.TB, opts ...Option) *Env {
	tb.Helper()
	e, err := New(opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := e.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return e
}

// Main is for TestMain: it starts one API server for the package, stores it in *env,
// runs the tests, stops the server and exits with the tests' status.
func Main(m *testing.M, env **Env, opts ...Option) {
	e, err := New(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		os.Exit(1)
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// AssetsDir returns the directory holding kube-apiserver, etcd and kubectl: AssetsEnv
// if set, otherwise the only complete version directory under
// ~/.cache/macfleet/k8s (where `make envtest` builds them), so `go test` works outside
// make too. The error says how to get the binaries.
func AssetsDir() (string, error) {
	const hint = "run `make envtest` (it builds them into ~/.cache/macfleet/k8s/<version>) and use `make test`, " +
		"or export " + AssetsEnv + " to that directory"
	if dir := os.Getenv(AssetsEnv); dir != "" {
		if missing := missingBinaries(dir); len(missing) > 0 {
			return "", fmt.Errorf("%s=%s lacks %v: %s", AssetsEnv, dir, missing, hint)
		}
		return dir, nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("%s is not set and there is no home directory to look in: %s", AssetsEnv, hint)
	}
	dirs, _ := filepath.Glob(filepath.Join(home, ".cache", "macfleet", "k8s", "*"))
	var complete []string
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() && len(missingBinaries(d)) == 0 {
			complete = append(complete, d)
		}
	}
	switch len(complete) {
	case 1:
		return complete[0], nil
	case 0:
		return "", fmt.Errorf("%s is not set and no kube-apiserver, etcd and kubectl are cached: %s", AssetsEnv, hint)
	default:
		return "", fmt.Errorf("%s is not set and several versions are cached (%v): use `make test` or export %s", AssetsEnv, complete, AssetsEnv)
	}
}

func missingBinaries(dir string) []string {
	var missing []string
	for _, b := range binaries {
		if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	return missing
}

// RepoRoot returns the root of the macfleet module, found by walking up from the
// working directory (a test's package directory) to the go.mod that declares it.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the repository root: %w", err)
	}
	for start := dir; ; {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && declaresModule(data, "github.com/macfleet/macfleet") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of github.com/macfleet/macfleet above %s", start)
		}
		dir = parent
	}
}

func declaresModule(gomod []byte, path string) bool {
	for line := range bytes.Lines(gomod) {
		if f := strings.Fields(string(line)); len(f) == 2 && f[0] == "module" && strings.Trim(f[1], `"`) == path {
			return true
		}
	}
	return false
}
