package server

import (
	"net/http"

	"github.com/macfleet/macfleet/pki"
)

// certAccess is what one request may do whose caller presented a certificate of the
// fleet CA (Options.ClientCertificates).
type certAccess struct {
	// refused, when not "", is why the request is answered 403 forbidden_caller.
	refused string
	// reportsQueues: the caller's X-Macfleet-Queued reports count (see caller).
	reportsQueues bool
}

// authorizeCertificate is the rule for callers with a fleet certificate, by the
// identity it names and the request's method and path (/healthz and /readyz are
// answered before it, to anyone):
//
//   - a gateway: the whole API, and its queue reports count;
//   - the manager: the whole API;
//   - a metrics scraper (macfleet://metrics/<name>): GET (or HEAD) /metrics only, so
//     that the credential Prometheus holds loads, unloads, clears and generates
//     nothing;
//   - a Mac, or any other kind: nothing, so one compromised Mac reaches no other.
func authorizeCertificate(id pki.Identity, method, path string) certAccess {
	switch id.Kind {
	case pki.KindGateway:
		return certAccess{reportsQueues: true}
	case pki.KindManager:
		return certAccess{}
	case pki.KindMetrics:
		if path == "/metrics" && (method == http.MethodGet || method == http.MethodHead) {
			return certAccess{}
		}
		return certAccess{refused: "the certificate of " + id.String() + " may only scrape a node agent (GET /metrics, /healthz, /readyz), not " +
			method + " " + path + ": only the gateways and the manager may call the rest of the API"}
	}
	return certAccess{refused: "the certificate of " + id.String() + " may not call a node agent: only the gateways and the manager may " +
		"(and tenants with a ServiceAccount token, on /v1/; a metrics scraper's certificate, on /metrics)"}
}
