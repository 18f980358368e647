package gateway

import (
	"context"
	"net/http"

	"github.com/macfleet/macfleet/gateway/admission"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/internal/openaierr"
)

// codeBudgetExceeded is the error code of a request over a TokenBudget;
// codeBudgetLease of one whose budget's lease could not be written.
const (
	codeBudgetExceeded = "token_budget_exceeded"
	codeBudgetLease    = "token_budget_lease_failed"
)

// reserve admits id's request a to rt against its budgets (admission.Budgets.Admit)
// for the most it can use: a's limits on the deployment's context (the largest of its
// template's and its routable replicas'), with its body. It counts the decision and
// the tokens held in the budget metrics; done releases them. A request the budgets
// capped to the room left is sent as body, bounded by lim, and its answer says so
// (capRequest); otherwise body and lim are a's.
func (g *Gateway) reserve(ctx context.Context, w http.ResponseWriter, id tenancy.Identity, rt *Route, a budgetAsk) (done func(), body []byte, lim metering.Limits, refusal *apiError) {
	n := rt.Context
	for _, be := range rt.Backends {
		n = max(n, be.Context)
	}
	a.lim.Context = int64(n)
	req := budgetRequest(a)
	end, capped, no := g.opts.Budgets.Admit(ctx, id, req)
	switch {
	case no != nil:
		g.metrics.budgetAdmissions.WithLabelValues(no.Reason).Inc()
		return nil, a.body, a.lim, budgetRefused(no)
	case end == nil: // not budgeted
		return nil, a.body, a.lim, nil
	}
	body, lim, outcome := a.body, a.lim, "admitted"
	if capped > 0 {
		var err error
		if body, lim, err = capRequest(w, a, capped); err != nil {
			end()
			return nil, a.body, a.lim, invalidRequest(openaierr.CodeInvalidJSON, "", "bad_request", "%v", err)
		}
		req.Output, outcome = capped, "capped"
	}
	g.metrics.budgetAdmissions.WithLabelValues(outcome).Inc()
	held := float64(req.Tokens())
	g.metrics.budgetReserved.Add(held)
	return func() {
		end()
		g.metrics.budgetReserved.Sub(held)
	}, body, lim, nil
}

// budgetRefused is the API error of a request the budgets refused: a 429 over a
// budget, a 503 to retry when its lease could not be written.
func budgetRefused(no *admission.Refusal) *apiError {
	if no.Leasing {
		return &apiError{Status: http.StatusServiceUnavailable, Type: openaierr.TypeUnavailable, Code: codeBudgetLease,
			Message: no.Message, RetryAfter: no.RetryAfter, reason: no.Reason}
	}
	return &apiError{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: codeBudgetExceeded,
		Message: no.Message, RetryAfter: no.RetryAfter, reason: no.Reason}
}
