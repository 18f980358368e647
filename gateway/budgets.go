package gateway

import (
	"context"
	"net/http"

	"github.com/macfleet/macfleet/gateway/admission"
	"github.com/macfleet/macfleet/gateway/budget"
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

// reserve admits id's request to rt against its budgets (admission.Budgets.Admit)
// for the most it can use: lim on the deployment's context (the largest of its
// template's and its routable replicas'), with a body of bodyBytes. It counts the
// decision and the tokens held in the budget metrics; done releases them.
func (g *Gateway) reserve(ctx context.Context, id tenancy.Identity, rt *Route, lim metering.Limits, bodyBytes int) (done func(), refusal *apiError) {
	n := rt.Context
	for _, be := range rt.Backends {
		n = max(n, be.Context)
	}
	lim.Context = int64(n)
	ask := budget.Ask(lim, bodyBytes)
	end, no := g.opts.Budgets.Admit(ctx, id, ask)
	switch {
	case no != nil:
		g.metrics.budgetAdmissions.WithLabelValues(no.Reason).Inc()
		return nil, budgetRefused(no)
	case end == nil: // not budgeted
		return nil, nil
	}
	g.metrics.budgetAdmissions.WithLabelValues("admitted").Inc()
	g.metrics.budgetReserved.Add(float64(ask))
	return func() {
		end()
		g.metrics.budgetReserved.Sub(float64(ask))
	}, nil
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
