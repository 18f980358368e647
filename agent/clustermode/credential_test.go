package clustermode

import (
	"testing"

	"github.com/go-logr/logr/testr"
	"k8s.io/client-go/rest"
)

// TestCredentialRenewalLeavesWhatItCannotRenew: a credential that is not a bound node
// token (a static token, a client certificate) gets no renewal and no error: the agent
// runs with it as it is, and the rest config is left alone.
func TestCredentialRenewalLeavesWhatItCannotRenew(t *testing.T) {
	for name, rc := range map[string]*rest.Config{
		"a static token":       {Host: "https://x", BearerToken: "static"},
		"a client certificate": {Host: "https://x", TLSClientConfig: rest.TLSClientConfig{CertData: []byte("c"), KeyData: []byte("k")}},
	} {
		before := rc.BearerToken
		r, err := CredentialRenewal(rc, "", testr.New(t))
		if err != nil || r != nil {
			t.Errorf("%s: renewal %v, error %v; want neither", name, r != nil, err)
		}
		if rc.BearerToken != before || rc.WrapTransport != nil {
			t.Errorf("%s: the rest config was changed", name)
		}
	}
}
