package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

var env *Env

func TestMain(m *testing.M) {
	Main(m, &env, WithCRDPaths("testdata/crd"))
}

func TestNewNamespace(t *testing.T) {
	var names []string
	for range 2 {
		names = append(names, NewNamespace(t, env.Client))
	}
	if names[0] == names[1] {
		t.Fatalf("two namespaces share the name %s", names[0])
	}
	for _, name := range names {
		if !strings.HasPrefix(name, "testnewnamespace-") {
			t.Errorf("namespace %s is not named after the test", name)
		}
		var ns corev1.Namespace
		if err := env.Client.Get(t.Context(), types.NamespacedName{Name: name}, &ns); err != nil {
			t.Errorf("getting namespace %s: %v", name, err)
		}
	}
}

// TestCRDValidation proves the CRDs from WithCRDPaths are installed and that the API
// server enforces their OpenAPI schema and CEL rules.
func TestCRDValidation(t *testing.T) {
	ns := NewNamespace(t, env.Client)
	tests := []struct {
		name    string
		spec    map[string]any
		wantErr string // substring; empty means accepted
	}{
		{name: "valid", spec: map[string]any{"size": int64(3), "color": "red"}},
		{name: "below minimum", spec: map[string]any{"size": int64(0)}, wantErr: "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1"},
		{name: "CEL rule", spec: map[string]any{"size": int64(1), "color": "red"}, wantErr: "a colored widget needs size 2 or more"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "testenv.macfleet.dev/v1",
				"kind":       "Widget",
				"metadata":   map[string]any{"name": fmt.Sprintf("w%d", i), "namespace": ns},
				"spec":       tt.spec,
			}}
			err := env.Client.Create(t.Context(), w)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("Create: %v", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("Create succeeded, want an error containing %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("Create error %q does not contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestNamePrefix(t *testing.T) {
	tests := []struct{ in, want string }{
		{"TestScheduler", "testscheduler-"},
		{"TestScheduler/bin_pack_3_nodes", "testscheduler-bin-pack-3-nodes-"},
		{"Test__Odd--Name__", "test-odd-name-"},
		{"TestAVeryLongNameThatGoesOnAndOn/with_a_subtest_name_too", "testaverylongnamethatgoesonandon-with-a-"},
		{"TestAVeryLongNameThatGoesOnAndOn/with/x", "testaverylongnamethatgoesonandon-with-x-"},
		{"Test0123456789012345678901234567890123/x", "test0123456789012345678901234567890123-x-"},
		{"Test01234567890123456789012345678901234/x", "test01234567890123456789012345678901234-"},
		{"///", "test-"},
	}
	for _, tt := range tests {
		if got := namePrefix(tt.in); got != tt.want {
			t.Errorf("namePrefix(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// fatalRecorder is a testing.TB whose Fatalf records the message and ends the
// goroutine, as the real one does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestEventually(t *testing.T) {
	tests := []struct {
		name      string
		trueAfter int // calls before cond reports done; -1 never
		timeout   time.Duration
		wantFatal string
	}{
		{name: "at once", trueAfter: 0, timeout: time.Second},
		{name: "after polling", trueAfter: 3, timeout: 5 * time.Second},
		{name: "never", trueAfter: -1, timeout: 100 * time.Millisecond, wantFatal: "Condition not met within 100ms: not yet (call "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &fatalRecorder{}
			calls := 0
			start := time.Now()
			done := make(chan struct{})
			go func() {
				defer close(done)
				Eventually(rec, tt.timeout, 10*time.Millisecond, func() (bool, string) {
					calls++
					if tt.trueAfter >= 0 && calls > tt.trueAfter {
						return true, ""
					}
					return false, fmt.Sprintf("not yet (call %d)", calls)
				})
			}()
			<-done
			elapsed := time.Since(start)
			if !strings.HasPrefix(rec.msg, tt.wantFatal) || (tt.wantFatal == "") != (rec.msg == "") {
				t.Errorf("Fatalf message %q, want prefix %q", rec.msg, tt.wantFatal)
			}
			if tt.wantFatal != "" && !strings.HasSuffix(rec.msg, fmt.Sprintf("(call %d)", calls)) {
				t.Errorf("Fatalf message %q does not carry the last message (call %d)", rec.msg, calls)
			}
			if tt.trueAfter >= 0 && calls != tt.trueAfter+1 {
				t.Errorf("cond called %d times, want %d", calls, tt.trueAfter+1)
			}
			if tt.wantFatal != "" && elapsed < tt.timeout {
				t.Errorf("gave up after %v, before the %v timeout", elapsed, tt.timeout)
			}
		})
	}
}

func TestAssetsDir(t *testing.T) {
	complete := func(t *testing.T, dir string, names ...string) string {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	tests := []struct {
		name    string
		setup   func(t *testing.T, home string) (assetsEnv string)
		wantDir string // relative to home
		wantErr string
	}{
		{
			name: "env complete",
			setup: func(t *testing.T, home string) string {
				return complete(t, filepath.Join(home, "assets"), binaries...)
			},
			wantDir: "assets",
		},
		{
			name: "env lacks etcd",
			setup: func(t *testing.T, home string) string {
				return complete(t, filepath.Join(home, "assets"), "kube-apiserver", "kubectl")
			},
			wantErr: "lacks [etcd]: run `make envtest`",
		},
		{
			name: "one cached version",
			setup: func(t *testing.T, home string) string {
				complete(t, filepath.Join(home, ".cache/macfleet/k8s/1.36.3-etcd3.6.6"), binaries...)
				complete(t, filepath.Join(home, ".cache/macfleet/k8s/1.36.3-etcd3.6.6.tmp.x"), "etcd")
				return ""
			},
			wantDir: ".cache/macfleet/k8s/1.36.3-etcd3.6.6",
		},
		{
			name:    "nothing cached",
			setup:   func(t *testing.T, home string) string { return "" },
			wantErr: "no kube-apiserver, etcd and kubectl are cached: run `make envtest`",
		},
		{
			name: "two cached versions",
			setup: func(t *testing.T, home string) string {
				complete(t, filepath.Join(home, ".cache/macfleet/k8s/a"), binaries...)
				complete(t, filepath.Join(home, ".cache/macfleet/k8s/b"), binaries...)
				return ""
			},
			wantErr: "several versions are cached",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			home := t.TempDir()
			t.Setenv("HOME", home)
			t.Setenv(AssetsEnv, tt.setup(t, home))
			dir, err := AssetsDir()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("AssetsDir() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(filepath.Join(home, tt.wantDir), dir); diff != "" {
				t.Errorf("AssetsDir() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(filepath.Join(root, "test", "support", "testenv"), wd); diff != "" {
		t.Errorf("RepoRoot() does not contain this package (-want +got):\n%s", diff)
	}
}

// TestLazy: nothing starts before the first Get, every Get returns the one server,
// and stopping stops it.
func TestLazy(t *testing.T) {
	l := NewLazy(WithCRDPaths("testdata/crd"))
	if err := l.stop(); err != nil || l.env != nil {
		t.Fatalf("stop before Get: %v, env %v", err, l.env)
	}
	e := l.Get(t)
	if again := l.Get(t); again != e {
		t.Errorf("a second Get returned another API server")
	}
	if err := e.Client.List(t.Context(), &corev1.NamespaceList{}); err != nil {
		t.Errorf("the API server does not answer: %v", err)
	}
	if err := l.stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
}
