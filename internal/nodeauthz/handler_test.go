package nodeauthz

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	authzv1 "k8s.io/api/authorization/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// TestHandler: the webhook reads the SubjectAccessReview the API server sends
// (authorization.k8s.io/v1, with the field selector's requirements) and answers in the
// same kind; anything else is a 400.
func TestHandler(t *testing.T) {
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "decisions_total"}, []string{"decision"})
	h := &Handler{Log: logr.Discard(), Decisions: decisions, Lookup: func(_ context.Context, ns, name string) (Binding, bool) {
		return Binding{Node: "mac-a"}, ns == "team-a" && name == "mine"
	}}
	review := func(attrs string) string {
		return `{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{` +
			`"user":"system:serviceaccount:macfleet-nodes:mac-a","groups":["system:serviceaccounts:macfleet-nodes"],` +
			`"resourceAttributes":` + attrs + `}}`
	}
	for _, tc := range []struct {
		name, body  string
		wantCode    int
		wantAllowed bool
	}{
		{"own watch", review(`{"verb":"watch","group":"macfleet.dev","version":"v1alpha1","resource":"modelreplicas",` +
			`"fieldSelector":{"requirements":[{"key":"spec.nodeName","operator":"In","values":["mac-a"]}]}}`), http.StatusOK, true},
		{"watch of its worker shards", review(`{"verb":"watch","group":"macfleet.dev","version":"v1alpha1","resource":"modelreplicas",` +
			`"labelSelector":{"requirements":[{"key":"` + v1alpha1.ShardLabel("mac-a") + `","operator":"Exists"}]}}`), http.StatusOK, true},
		{"watch of another Mac's worker shards", review(`{"verb":"watch","group":"macfleet.dev","version":"v1alpha1","resource":"modelreplicas",` +
			`"labelSelector":{"requirements":[{"key":"` + v1alpha1.ShardLabel("mac-b") + `","operator":"Exists"}]}}`), http.StatusOK, false},
		{"watch of all", review(`{"verb":"watch","group":"macfleet.dev","version":"v1alpha1","resource":"modelreplicas"}`), http.StatusOK, false},
		{"get own", review(`{"verb":"get","group":"macfleet.dev","resource":"modelreplicas","namespace":"team-a","name":"mine"}`), http.StatusOK, true},
		{"get another", review(`{"verb":"get","group":"macfleet.dev","resource":"modelreplicas","namespace":"team-b","name":"x"}`), http.StatusOK, false},
		{"patch of status", review(`{"verb":"patch","group":"macfleet.dev","resource":"modelreplicas","subresource":"status","namespace":"team-a","name":"mine"}`),
			http.StatusOK, false},
		{"not JSON", "{", http.StatusBadRequest, false},
		{"another kind", `{"apiVersion":"authorization.k8s.io/v1beta1","kind":"SubjectAccessReview"}`, http.StatusBadRequest, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, Path, strings.NewReader(tc.body)))
			if rec.Code != tc.wantCode {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.wantCode, rec.Body)
			}
			if tc.wantCode != http.StatusOK {
				return
			}
			var got authzv1.SubjectAccessReview
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if got.APIVersion != "authorization.k8s.io/v1" || got.Kind != "SubjectAccessReview" {
				t.Errorf("answered a %s %s", got.APIVersion, got.Kind)
			}
			// A read not allowed is denied; a write gets no opinion (RBAC decides).
			wantDenied := !tc.wantAllowed && !strings.Contains(tc.body, `"verb":"patch"`)
			if got.Status.Allowed != tc.wantAllowed || got.Status.Denied != wantDenied || got.Status.Reason == "" {
				t.Errorf("status %+v, want allowed %v, denied %v, with a reason", got.Status, tc.wantAllowed, wantDenied)
			}
		})
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, Path, nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", rec.Code)
	}
	allowed, denied := testutil.ToFloat64(decisions.WithLabelValues("allowed")), testutil.ToFloat64(decisions.WithLabelValues("denied"))
	none := testutil.ToFloat64(decisions.WithLabelValues("no-opinion"))
	if allowed != 3 || denied != 3 || none != 1 {
		t.Errorf("counted %v allowed, %v denied and %v no-opinion answers, want 3, 3 and 1", allowed, denied, none)
	}
}
