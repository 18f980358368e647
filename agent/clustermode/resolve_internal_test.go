package clustermode

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// TestResolveSendsBudgetedCallersToTheGateway: a caller whose namespace is in the
// replica's budgetedNamespaces is refused with a 403 naming the gateway, by name and
// by the replica header; the fleet token (the gateway's own requests) and callers of
// other namespaces are not; a model the caller may not use stays a 404.
func TestResolveSendsBudgetedCallersToTheGateway(t *testing.T) {
	gauge, err := enginepool.NewGauge()
	if err != nil {
		t.Fatal(err)
	}
	pool, err := enginepool.New(enginepool.Config{CeilingBytes: 1 << 30}, runnerproc.NewProcessFactory(runnerproc.ProcessConfig{SocketDir: t.TempDir()}),
		gauge, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	tmpl := v1alpha1.ModelReplicaTemplate{Model: v1alpha1.ModelSource{Source: "file:///qwen.gguf"}}
	s := &Syncer{opts: SyncerOptions{Pool: pool}, replicas: map[string]*replica{
		"team-b/qwen-0": {key: "team-b/qwen-0", namespace: "team-b", deployment: "qwen", template: tmpl, phase: phaseRegistered,
			access: []string{"team-a", "team-c"}, budgeted: []string{"team-a"}},
	}}
	for _, tc := range []struct {
		name    string
		id      tenancy.Identity
		replica bool // by the X-Macfleet-Replica header
		status  int  // 0: not refused by tenancy (the pool has no such model: downloading)
	}{
		{name: "budgeted namespace", id: tenancy.Identity{Namespace: "team-a", Name: "system:serviceaccount:ci"}, status: http.StatusForbidden},
		{name: "budgeted namespace by replica", id: tenancy.Identity{Namespace: "team-a"}, replica: true, status: http.StatusForbidden},
		{name: "granted without a budget", id: tenancy.Identity{Namespace: "team-c"}},
		{name: "own namespace without a budget", id: tenancy.Identity{Namespace: "team-b"}},
		{name: "the fleet token", id: tenancy.Identity{Admin: true}},
		{name: "not granted", id: tenancy.Identity{Namespace: "team-d"}, status: http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
			r = r.WithContext(tenancy.WithIdentity(r.Context(), tc.id))
			model := "qwen"
			if tc.replica {
				r.Header.Set(v1alpha1.HeaderReplica, "team-b/qwen-0")
				model = "team-b/qwen-0"
			}
			_, err := s.Resolve(r, model)
			se, ok := enginepool.AsStatusError(err)
			if !ok {
				t.Fatalf("error %v is not a status error", err)
			}
			var gateway *ThroughGatewayError
			switch tc.status {
			case http.StatusForbidden:
				if !errors.As(err, &gateway) || se.HTTPStatus() != http.StatusForbidden || gateway.Deployment != "team-b/qwen" {
					t.Errorf("error %v (%d), want a 403 through the gateway for team-b/qwen", err, se.HTTPStatus())
				}
			case http.StatusNotFound:
				if se.HTTPStatus() != http.StatusNotFound {
					t.Errorf("error %v (%d), want a 404", err, se.HTTPStatus())
				}
			default:
				if errors.As(err, &gateway) || se.Code() != enginepool.CodeModelLoading {
					t.Errorf("error %v, want the model still downloading (served once it is)", err)
				}
			}
		})
	}
}
