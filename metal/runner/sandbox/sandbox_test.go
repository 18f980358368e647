package sandbox

import (
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
