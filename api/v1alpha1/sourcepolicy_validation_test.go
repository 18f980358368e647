package v1alpha1_test

import (
	"context"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

func TestSourcePolicyValidation(t *testing.T) {
	ctx := t.Context()
	valid := func() mfv1.SourcePolicySpec {
		return mfv1.SourcePolicySpec{
			Rules: []mfv1.SourcePolicyRule{{Namespaces: []string{"*"}, Registries: []mfv1.SourceRegistry{mfv1.RegistryHF},
				Hosts: []string{"models.example.com", "*.mirror.example.org", "10.0.3.7", "fd00::7"}, FileDirectories: []string{"/opt/models"}}},
			DeniedNetworks:  []string{"10.96.0.0/12", "fd00:10:96::/112"},
			AllowedNetworks: []string{"127.0.0.0/8"},
		}
	}
	cases := []struct {
		name    string
		objName string
		mutate  func(*mfv1.SourcePolicySpec)
		wantErr string
	}{
		{name: "valid", mutate: func(*mfv1.SourcePolicySpec) {}},
		{name: "another name", objName: "team-a", mutate: func(*mfv1.SourcePolicySpec) {},
			wantErr: `the fleet reads only the SourcePolicy named "default"`},
		{name: "host with a scheme", mutate: func(s *mfv1.SourcePolicySpec) { s.Rules[0].Hosts = []string{"https://models.example.com"} },
			wantErr: `hosts are host names or IP addresses without scheme, port or path, optionally starting with "*."`},
		{name: "host with a path", mutate: func(s *mfv1.SourcePolicySpec) { s.Rules[0].Hosts = []string{"models.example.com/x"} },
			wantErr: "hosts are host names or IP addresses"},
		{name: "relative directory", mutate: func(s *mfv1.SourcePolicySpec) { s.Rules[0].FileDirectories = []string{"models"} },
			wantErr: "fileDirectories must be absolute paths without . or .. segments"},
		{name: "directory with ..", mutate: func(s *mfv1.SourcePolicySpec) { s.Rules[0].FileDirectories = []string{"/opt/models/.."} },
			wantErr: "fileDirectories must be absolute paths"},
		{name: "not a CIDR", mutate: func(s *mfv1.SourcePolicySpec) { s.DeniedNetworks = []string{"10.96.0.1"} },
			wantErr: "deniedNetworks must be CIDRs such as 10.96.0.0/12"},
		{name: "allowed not a CIDR", mutate: func(s *mfv1.SourcePolicySpec) { s.AllowedNetworks = []string{"localhost"} },
			wantErr: "allowedNetworks must be CIDRs such as 127.0.0.0/8"},
		{name: "unknown registry", mutate: func(s *mfv1.SourcePolicySpec) { s.Rules[0].Registries = []mfv1.SourceRegistry{"docker"} },
			wantErr: `Unsupported value: "docker"`},
		{name: "rule without namespaces", mutate: func(s *mfv1.SourcePolicySpec) { s.Rules[0].Namespaces = nil },
			wantErr: "namespaces"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := tc.objName
			if name == "" {
				name = mfv1.SourcePolicyName
			}
			// Other tests apply the examples' SourcePolicy; start from none.
			if err := env.Client.Delete(ctx, &mfv1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
			spec := valid()
			tc.mutate(&spec)
			sp := &mfv1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
			err := env.Client.Create(ctx, sp)
			if err == nil {
				t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sp) })
			}
			checkErr(t, err, tc.wantErr)
		})
	}
}
