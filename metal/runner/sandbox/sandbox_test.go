package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestEnv(t *testing.T) {
	for _, tc := range []struct {
		name          string
		parent, extra []string
		want          []string
	}{
		{"secrets dropped", []string{"KUBECONFIG=/home/a/.kube/config", "HOME=/home/a", "MACFLEET_FLEET_TOKEN=t",
			"AWS_SECRET_ACCESS_KEY=k", "PATH=/usr/bin", "SSH_AUTH_SOCK=/tmp/ssh"}, nil, []string{}},
		{"runtime and engine knobs kept", []string{"TZ=UTC", "GOMAXPROCS=4", "GGML_METAL_NDEBUG=1", "GGMLX=1", "GODEBUGX=1"}, nil,
			[]string{"TZ=UTC", "GOMAXPROCS=4", "GGML_METAL_NDEBUG=1"}},
		{"explicit environment after", []string{"TZ=UTC", "KUBECONFIG=/k"}, []string{"TZ=Europe/Paris", "KUBECONFIG=/runner"},
			[]string{"TZ=UTC", "TZ=Europe/Paris", "KUBECONFIG=/runner"}},
		{"malformed entry dropped", []string{"TZ", "=x"}, nil, []string{}},
		// The agent exports the runner's spans: no collector address or credential.
		{"tracing settings dropped", []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://c:4318", "OTEL_EXPORTER_OTLP_HEADERS=authorization=k",
			"OTEL_RESOURCE_ATTRIBUTES=a=b", "KUBECONFIG=/k"}, nil, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Env(tc.parent, tc.extra)); diff != "" {
				t.Errorf("Env (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": On, "on": On, "off": Off} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseMode("yes"); err == nil || !strings.Contains(err.Error(), `want "on" or "off"`) {
		t.Errorf("ParseMode(yes): %v, want an error naming the values", err)
	}
}

func TestHoldsBackend(t *testing.T) {
	for _, tc := range []struct {
		name    string
		files   []string // "name/" is a directory
		pattern string
		want    bool
	}{
		{"cuda backend", []string{"libggml-base.so", "libggml-cuda.so"}, "libggml-*.so", true},
		{"a mac backend", []string{"libggml-vulkan.dylib"}, "libggml-*.dylib", true},
		{"base and cpu only", []string{"libggml-base.so", "libggml-cpu-haswell.so", "libggml-cpu.so"}, "libggml-*.so", false},
		{"another platform's library", []string{"libggml-cuda.dylib", "ggml-cuda.dll"}, "libggml-*.so", false},
		{"a directory of the name", []string{"libggml-cuda.so/"}, "libggml-*.so", false},
		{"other files", []string{"libcudart.so.12", "README"}, "libggml-*.so", false},
		{"empty", nil, "libggml-*.so", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				var err error
				if name, ok := strings.CutSuffix(f, "/"); ok {
					err = os.Mkdir(filepath.Join(dir, name), 0o700)
				} else {
					err = os.WriteFile(filepath.Join(dir, f), nil, 0o600)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if got := holdsBackend(dir, tc.pattern); got != tc.want {
				t.Errorf("holdsBackend(%q) = %v, want %v", tc.files, got, tc.want)
			}
		})
	}
	for _, dir := range []string{"", filepath.Join(t.TempDir(), "missing")} {
		if holdsBackend(dir, "libggml-*.so") {
			t.Errorf("holdsBackend(%q) = true for no directory", dir)
		}
	}
}
