package credentials

import (
	"strings"
	"testing"
)

func TestCheckAdminServer(t *testing.T) {
	for _, tc := range []struct {
		host    string
		refused bool
	}{
		{"https://127.0.0.1:6443", true}, // k3s's admin kubeconfig
		{"127.0.0.1:34567", true},        // envtest's rest.Config.Host
		{"https://127.0.1.1:6443", true},
		{"https://[::1]:6443", true},
		{"https://localhost:6443", true},
		{"https://LOCALHOST", true},
		{"https://api.localhost:6443", true},
		{"https://192.168.1.10:6443", false},
		{"https://k8s.example.com", false},
		{"https://[fd00::1]:6443", false},
		{"https://0x7f.example.com:6443", false},
		{"", false},
	} {
		err := CheckAdminServer(tc.host)
		if (err != nil) != tc.refused {
			t.Errorf("CheckAdminServer(%q) = %v; refused %v, want %v", tc.host, err, err != nil, tc.refused)
		}
		if err != nil && !strings.Contains(err.Error(), "--server") {
			t.Errorf("CheckAdminServer(%q) = %v; want the fix, --server, named", tc.host, err)
		}
	}
}
