package server

import (
	"strings"
	"testing"

	"github.com/macfleet/macfleet/pki"
)

func TestAuthorizeCertificate(t *testing.T) {
	const everything = ""
	for _, tc := range []struct {
		id            pki.Identity
		method, path  string
		refused       string // a part of the reason; everything: allowed
		reportsQueues bool
	}{
		{id: pki.Gateway("gw"), method: "POST", path: "/api/models/m/unload", refused: everything, reportsQueues: true},
		{id: pki.Gateway("gw"), method: "POST", path: "/v1/chat/completions", refused: everything, reportsQueues: true},
		{id: pki.Manager("mgr"), method: "GET", path: "/api/status", refused: everything},
		{id: pki.Manager("mgr"), method: "POST", path: "/api/cache/clear", refused: everything},
		{id: pki.Gateway("gw"), method: "GET", path: "/api/models/m/prefixes", refused: everything, reportsQueues: true},
		{id: pki.Manager("mgr"), method: "GET", path: "/api/models/m/prefixes", refused: everything},
		{id: pki.Metrics("prometheus"), method: "GET", path: "/api/models/m/prefixes", refused: "may only scrape"},
		{id: pki.Node("mac-2"), method: "GET", path: "/api/models/m/prefixes", refused: "may not call a node agent"},
		{id: pki.Identity{Kind: "tenant", Name: "x"}, method: "GET", path: "/api/models/m/prefixes", refused: "may not call a node agent"},
		{id: pki.Metrics("prometheus"), method: "GET", path: "/metrics", refused: everything},
		{id: pki.Metrics("prometheus"), method: "HEAD", path: "/metrics", refused: everything},
		{id: pki.Metrics("prometheus"), method: "POST", path: "/metrics", refused: "not POST /metrics"},
		{id: pki.Metrics("prometheus"), method: "GET", path: "/metrics/", refused: "not GET /metrics/"},
		{id: pki.Metrics("prometheus"), method: "POST", path: "/api/models/m/unload", refused: "macfleet://metrics/prometheus may only scrape"},
		{id: pki.Metrics("prometheus"), method: "POST", path: "/api/models/m/load", refused: "may only scrape"},
		{id: pki.Metrics("prometheus"), method: "POST", path: "/api/cache/clear", refused: "may only scrape"},
		{id: pki.Metrics("prometheus"), method: "POST", path: "/api/requests/cancel", refused: "may only scrape"},
		{id: pki.Metrics("prometheus"), method: "GET", path: "/api/status", refused: "may only scrape"},
		{id: pki.Metrics("prometheus"), method: "POST", path: "/v1/chat/completions", refused: "may only scrape"},
		{id: pki.Metrics("prometheus"), method: "GET", path: "/v1/models", refused: "may only scrape"},
		{id: pki.Node("mac-2"), method: "GET", path: "/metrics", refused: "macfleet://node/mac-2 may not call a node agent"},
		{id: pki.Node("mac-2"), method: "POST", path: "/api/models/m/unload", refused: "may not call a node agent"},
		{id: pki.Identity{Kind: "tenant", Name: "x"}, method: "GET", path: "/v1/models", refused: "may not call a node agent"},
	} {
		got := authorizeCertificate(tc.id, tc.method, tc.path)
		if tc.refused == everything && got.refused != "" || tc.refused != everything && !strings.Contains(got.refused, tc.refused) ||
			got.reportsQueues != tc.reportsQueues {
			t.Errorf("authorizeCertificate(%s, %s %s) = %+v; want refused containing %q (\"\": allowed), reportsQueues %t",
				tc.id, tc.method, tc.path, got, tc.refused, tc.reportsQueues)
		}
	}
}
