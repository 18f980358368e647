package server

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/internal/pki"
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
		// The split link: a Mac's certificate reaches its handler, which checks the
		// replica (agent/splitlink); nothing else under it, and no other method.
		{id: pki.Node("mac-2"), method: "GET", path: "/api/split/team-a/big-0", refused: everything},
		{id: pki.Node("mac-2"), method: "POST", path: "/api/split/team-a/big-0", refused: "may not call a node agent"},
		{id: pki.Node("mac-2"), method: "GET", path: "/api/splits", refused: "may not call a node agent"},
		{id: pki.Metrics("prometheus"), method: "GET", path: "/api/split/team-a/big-0", refused: "may only scrape"},
		// The warm-up (POST /api/models/{id}/states/warm): the gateways and the manager only.
		{id: pki.Gateway("gw"), method: "POST", path: "/api/models/m/states/warm", refused: everything, reportsQueues: true},
		{id: pki.Manager("mgr"), method: "POST", path: "/api/models/m/states/warm", refused: everything},
		{id: pki.Node("mac-2"), method: "POST", path: "/api/models/m/states/warm", refused: "may not call a node agent"},
		{id: pki.Metrics("prometheus"), method: "POST", path: "/api/models/m/states/warm", refused: "may only scrape"},
		{id: pki.Identity{Kind: "tenant", Name: "x"}, method: "POST", path: "/api/models/m/states/warm", refused: "may not call a node agent"},
	} {
		got := authorizeCertificate(tc.id, certRequest{method: tc.method, path: tc.path}, ticketCheck{})
		if tc.refused == everything && got.refused != "" || tc.refused != everything && !strings.Contains(got.refused, tc.refused) ||
			got.reportsQueues != tc.reportsQueues {
			t.Errorf("authorizeCertificate(%s, %s %s) = %+v; want refused containing %q (\"\": allowed), reportsQueues %t",
				tc.id, tc.method, tc.path, got, tc.refused, tc.reportsQueues)
		}
	}
}

// TestAuthorizeCertificateStateTickets: a Mac's certificate reaches exactly one thing,
// GET /api/models/{id}/states/{digest}, and only with a gateway's ticket naming that
// Mac, this agent's Mac, that model and that digest, before it expires.
func TestAuthorizeCertificateStateTickets(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ca, err := pki.NewCA(t0, pki.DefaultCALifetime)
	if err != nil {
		t.Fatal(err)
	}
	cert := func(id pki.Identity) *tls.Certificate {
		src, err := ca.NewSource(&id, t0, pki.DefaultLeafLifetime)
		if err != nil {
			t.Fatal(err)
		}
		return src.Certificate()
	}
	gw, mac3 := cert(pki.Gateway("gw")), cert(pki.Node("mac-3"))
	sign := func(signer *tls.Certificate, edit func(*pki.StateTicket)) string {
		st := pki.StateTicket{Target: "mac-2", Source: "mac-1", Model: "team-a/chat-0", Digest: "00112233aabbccdd",
			Partition: "team-a", Issued: t0, Expires: t0.Add(20 * time.Second)}
		if edit != nil {
			edit(&st)
		}
		s, err := pki.SignTicket(st, signer)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	const path = "/api/models/team-a%2Fchat-0/states/00112233aabbccdd"
	valid := sign(gw, nil)
	on := ticketCheck{node: "mac-1", roots: pki.Pool([]*x509.Certificate{ca.Cert}), now: t0.Add(time.Second)}
	mac2 := pki.Node("mac-2")
	for _, tc := range []struct {
		name    string
		id      pki.Identity
		req     certRequest
		check   ticketCheck
		refused string // "": allowed
	}{
		{name: "its own ticket", id: mac2, req: certRequest{"GET", path, valid}, check: on},
		{name: "no ticket", id: mac2, req: certRequest{"GET", path, ""}, check: on, refused: "no state ticket"},
		{name: "another Mac's ticket", id: mac2, req: certRequest{"GET", path, sign(gw, func(s *pki.StateTicket) { s.Target = "mac-3" })},
			check: on, refused: `for Mac "mac-3", not "mac-2"`},
		{name: "a ticket for another source", id: mac2, req: certRequest{"GET", path, sign(gw, func(s *pki.StateTicket) { s.Source = "mac-9" })},
			check: on, refused: `from Mac "mac-9", not "mac-1"`},
		{name: "expired", id: mac2, req: certRequest{"GET", path, valid},
			check: ticketCheck{node: on.node, roots: on.roots, now: t0.Add(20 * time.Second)}, refused: "expired"},
		{name: "another digest", id: mac2, req: certRequest{"GET", "/api/models/team-a%2Fchat-0/states/ffffffffffffffff", valid},
			check: on, refused: `digest "00112233aabbccdd", not "ffffffffffffffff"`},
		{name: "another model", id: mac2, req: certRequest{"GET", "/api/models/team-b%2Fchat-0/states/00112233aabbccdd", valid},
			check: on, refused: `model "team-a/chat-0", not "team-b/chat-0"`},
		{name: "signed by a Mac", id: mac2, req: certRequest{"GET", path, sign(mac3, nil)}, check: on, refused: "not a gateway"},
		{name: "the ticket on another path", id: mac2, req: certRequest{"GET", "/api/models/team-a%2Fchat-0/prefixes", valid},
			check: on, refused: "may not call a node agent"},
		{name: "the ticket on the OpenAI API", id: mac2, req: certRequest{"POST", "/v1/chat/completions", valid},
			check: on, refused: "may not call a node agent"},
		{name: "another method", id: mac2, req: certRequest{"POST", path, valid}, check: on, refused: "may not call a node agent"},
		{name: "the ticket on the warm-up", id: mac2, req: certRequest{"POST", "/api/models/team-a%2Fchat-0/states/warm", valid},
			check: on, refused: "may not call a node agent"},
		{name: "peer fetch off", id: mac2, req: certRequest{"GET", path, valid}, check: ticketCheck{}, refused: "may not call a node agent"},
		{name: "a gateway needs no ticket", id: pki.Gateway("gw"), req: certRequest{"GET", path, ""}, check: on},
		{name: "nor does the manager", id: pki.Manager("mgr"), req: certRequest{"GET", path, ""}, check: on},
		{name: "a scraper with a ticket", id: pki.Metrics("prometheus"), req: certRequest{"GET", path, valid}, check: on, refused: "may only scrape"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := authorizeCertificate(tc.id, tc.req, tc.check)
			if tc.refused == "" {
				if got.refused != "" {
					t.Fatalf("refused: %s", got.refused)
				}
				if tc.id.Kind == pki.KindNode && (got.ticket == nil || got.ticket.Partition != "team-a") {
					t.Fatalf("ticket %+v, want the ticket's claims with partition team-a", got.ticket)
				}
				return
			}
			if !strings.Contains(got.refused, tc.refused) || got.ticket != nil {
				t.Fatalf("got %+v; want refused containing %q and no ticket", got, tc.refused)
			}
		})
	}
}

func TestStatePath(t *testing.T) {
	for _, tc := range []struct {
		path          string
		model, digest string
		ok            bool
	}{
		{"/api/models/team-a%2Fchat-0/states/0011", "team-a/chat-0", "0011", true},
		{"/api/models/tiny/states/0011", "tiny", "0011", true},
		{"/api/models/team-a/chat-0/states/0011", "", "", false},
		{"/api/models/tiny/states/", "", "", false},
		{"/api/models//states/0011", "", "", false},
		{"/api/models/tiny/prefixes", "", "", false},
		{"/api/models/tiny/states/0011/x", "", "", false},
	} {
		m, d, ok := statePath(tc.path)
		if m != tc.model || d != tc.digest || ok != tc.ok {
			t.Errorf("statePath(%q) = %q, %q, %t; want %q, %q, %t", tc.path, m, d, ok, tc.model, tc.digest, tc.ok)
		}
	}
}
