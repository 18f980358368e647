package estimate

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

func loopbackAllowed(t *testing.T) *sourcepolicy.Holder {
	t.Helper()
	p, err := sourcepolicy.Compile(&v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: v1alpha1.SourcePolicySpec{AllowedNetworks: []string{"127.0.0.0/8"}}})
	if err != nil {
		t.Fatal(err)
	}
	return sourcepolicy.NewHolder(p)
}

func wantDenial(t *testing.T, err error, want string) {
	t.Helper()
	var de *sourcepolicy.DeniedError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Estimate: %v, want a *sourcepolicy.DeniedError containing %q", err, want)
	}
}

// The header's range requests connect through the policy: the default refuses the
// loopback server before a byte is asked for, and an explicit allowance lets the
// same estimate through.
func TestEstimateFollowsTheSourcePolicy(t *testing.T) {
	path := model(t, ggufsynth.Tiny())
	srv := serveFile(t, path)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	// A name, so that only the resolved address tells it is loopback.
	u := "http://localhost:" + port + "/tiny.gguf"

	def := sourcepolicy.NewHolder(nil)
	_, err := Estimate(t.Context(), Params{URL: u, HTTPClient: def.Client(nil), Dial: def.Dialer().DialContext})
	wantDenial(t, err, "is loopback, which model fetches may not connect to")
	if n := srv.requests.Load(); n != 0 {
		t.Fatalf("the server saw %d requests, want none", n)
	}

	allowed := loopbackAllowed(t)
	var dials atomic.Int64
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return allowed.Dialer().DialContext(ctx, network, addr)
	}
	got, err := Estimate(t.Context(), Params{URL: u, ContextLength: 512, HTTPClient: allowed.Client(nil), Dial: dial})
	if err != nil {
		t.Fatal(err)
	}
	want, err := Estimate(t.Context(), Params{Path: path, ContextLength: 512})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("estimate through the policy differs from the local one (-local +remote):\n%s", diff)
	}
	if dials.Load() == 0 {
		t.Error("the header's requests did not dial through Dial")
	}

	// Dial decides even where HTTPClient's own dialer would let the address through.
	_, err = Estimate(t.Context(), Params{URL: u, HTTPClient: allowed.Client(nil), Dial: def.Dialer().DialContext})
	wantDenial(t, err, "is loopback")
}
