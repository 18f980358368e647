package server

import (
	"fmt"
	"net/http"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// continueHeaders are the headers with which a gateway continues a stream it relayed
// on another replica (docs/fleet.md, "Continuing a broken stream"): the answer the
// client already has is the request's last message, and the runner counts it as
// output already generated, not as prompt. From anyone else they would let a caller
// have a long conversation read as a short prompt.
var continueHeaders = [...]string{runnerapi.HeaderContinue, runnerapi.HeaderContinuedTokens, runnerapi.HeaderContinuedTokenIDs,
	runnerapi.HeaderResumeStream}

// codeGatewayHeader is the error code of a request that carries a gateway's header
// from another caller.
const codeGatewayHeader = "gateway_only_header"

// continueHeadersRefusal is the 403 of a request that carries a continuation header
// (continueHeaders) from a caller that is not a gateway: the gateway's identity is a
// gateway's certificate or, where the agent takes no certificates, the fleet's API key
// (the callers whose queue reports count, caller.reportsQueues); nil when it may.
func continueHeadersRefusal(h http.Header, c caller) *apiError {
	if c.reportsQueues {
		return nil
	}
	for _, name := range continueHeaders {
		if h.Get(name) != "" {
			return &apiError{Status: http.StatusForbidden, Type: typePermission, Code: codeGatewayHeader,
				Message: fmt.Sprintf("%s is the gateways' header (it continues a stream a gateway relayed) and this caller is not a gateway: "+
					"send the request without it, or through the gateway", name)}
		}
	}
	return nil
}
