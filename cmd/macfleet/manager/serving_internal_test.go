package manager

import (
	"strings"
	"testing"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

// TestCheckServing: the manager refuses to start with a serving Secret that is one it
// keeps for something else, hosts without a Secret, or hosts no certificate can name.
func TestCheckServing(t *testing.T) {
	for _, tc := range []struct {
		secret  string
		hosts   []string
		wantErr string
	}{
		{},
		{secret: "macfleet-gateway-https", hosts: []string{"llm.example.com", "10.1.2.3"}},
		{hosts: []string{"llm.example.com"}, wantErr: "needs --gateway-serving-secret"},
		{secret: mfv1.CASecret, hosts: []string{"llm.example.com"}, wantErr: "keeps for something else"},
		{secret: mfv1.GatewayTLSSecret, hosts: []string{"llm.example.com"}, wantErr: "keeps for something else"},
		{secret: mfv1.APIKeyIndexSecret, hosts: []string{"llm.example.com"}, wantErr: "keeps for something else"},
		{secret: "macfleet-gateway-https", wantErr: "at least one"},
		{secret: "macfleet-gateway-https", hosts: []string{"llm example"}, wantErr: "--gateway-serving-hosts: host"},
	} {
		err := checkServing(tc.secret, tc.hosts)
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("checkServing(%q, %q) = %v, want %q", tc.secret, tc.hosts, err, tc.wantErr)
		}
	}
}
