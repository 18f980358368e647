package server

import (
	"crypto/x509"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/internal/pki"
)

// certAccess is what one request may do whose caller presented a certificate of the
// fleet CA (Options.ClientCertificates).
type certAccess struct {
	// refused, when not "", is why the request is answered 403 forbidden_caller.
	refused string
	// reportsQueues: the caller's X-Macfleet-Queued reports count (see caller).
	reportsQueues bool
	// gateway: the caller is a gateway, whose peer fetch hints
	// (runnerapi.HeaderPeerState) the agent follows.
	gateway bool
	// ticket, for a Mac's fetch of a prompt state, is the checked ticket that grants
	// it: its partition is the one the state is looked up in.
	ticket *pki.StateTicket
}

// certRequest is what authorizeCertificate reads of a request: its method, its
// escaped path and the state ticket it presents (runnerapi.HeaderPeerTicket).
type certRequest struct {
	method, path, ticket string
}

// ticketCheck is what a state ticket is checked against: this agent's Mac, the fleet
// CA bundle and the time. The zero value (no Mac: peer fetch off) grants nothing.
type ticketCheck struct {
	node  string
	roots *x509.CertPool
	now   time.Time
}

// authorizeCertificate is the rule for callers with a fleet certificate, by the
// identity it names and the request's method and path (/healthz and /readyz are
// answered before it, to anyone):
//
//   - a gateway: the whole API, its queue reports count and its peer fetch hints are
//     followed;
//   - the manager: the whole API;
//   - a metrics scraper (macfleet://metrics/<name>): GET (or HEAD) /metrics only, so
//     that the credential Prometheus holds loads, unloads, clears and generates
//     nothing;
//   - a Mac: GET /api/models/{id}/states/{digest} only, and only with a gateway's
//     ticket (pki.VerifyTicket) naming that Mac as the one fetching, this agent's Mac
//     as the source, that model and that digest; nothing else, so one compromised Mac
//     reaches no other beyond the states the gateways handed it; and GET
//     /api/split/{namespace}/{replica}, the link of a split replica's head to this
//     Mac's worker shard, which Options.SplitLink grants only to the Mac of that
//     replica's head (agent/splitlink.Authorize), and its /peer link, only to the Mac of
//     the worker shard before this Mac's (agent/splitlink.AuthorizePeer);
//   - any other kind: nothing.
func authorizeCertificate(id pki.Identity, req certRequest, tc ticketCheck) certAccess {
	switch id.Kind {
	case pki.KindGateway:
		return certAccess{reportsQueues: true, gateway: true}
	case pki.KindManager:
		return certAccess{}
	case pki.KindMetrics:
		if req.path == "/metrics" && (req.method == http.MethodGet || req.method == http.MethodHead) {
			return certAccess{}
		}
		return certAccess{refused: "the certificate of " + id.String() + " may only scrape a node agent (GET /metrics, /healthz, /readyz), not " +
			req.method + " " + req.path + ": only the gateways and the manager may call the rest of the API"}
	case pki.KindNode:
		if req.method == http.MethodGet && strings.HasPrefix(req.path, splitPathPrefix) {
			return certAccess{} // the split link's handler checks the caller against the replica
		}
		model, digest, ok := statePath(req.path)
		if !ok || req.method != http.MethodGet || tc.node == "" {
			break
		}
		t, err := pki.VerifyTicket(req.ticket, tc.roots, tc.now)
		if err == nil {
			err = t.Grants(id.Name, tc.node, model, digest)
		}
		if err != nil {
			return certAccess{refused: "the certificate of " + id.String() + " may fetch a prompt state only with a gateway's ticket for it (" +
				runnerapi.HeaderPeerTicket + "): " + err.Error()}
		}
		return certAccess{ticket: &t}
	}
	return certAccess{refused: "the certificate of " + id.String() + " may not call a node agent: only the gateways and the manager may " +
		"(and tenants with a ServiceAccount token, on /v1/; a metrics scraper's certificate, on /metrics; " +
		"a Mac's, on a prompt state a gateway's ticket grants it and on the split link of a replica it is the head of)"}
}

// splitPathPrefix starts the split link's path (agent/splitlink.Path).
const splitPathPrefix = "/api/split/"

// statePath reads the model id and digest of an escaped path
// /api/models/{id}/states/{digest}; ok false for any other path.
func statePath(escaped string) (model, digest string, ok bool) {
	parts := strings.Split(escaped, "/")
	if len(parts) != 6 || parts[0] != "" || parts[1] != "api" || parts[2] != "models" || parts[4] != "states" || parts[5] == "" {
		return "", "", false
	}
	model, err := url.PathUnescape(parts[3])
	if err != nil || model == "" {
		return "", "", false
	}
	digest, err = url.PathUnescape(parts[5])
	if err != nil {
		return "", "", false
	}
	return model, digest, true
}
