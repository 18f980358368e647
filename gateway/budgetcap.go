package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/tidwall/sjson"

	"github.com/macfleet/macfleet/gateway/budget"
	"github.com/macfleet/macfleet/gateway/metering"
)

// A request that asks for more than the room left in its TokenBudgets' windows (say
// n: 16 without max_tokens, each choice bounded only by the context) is not refused:
// the budgets cap each choice's output to what the room leaves (budget.Fit), and the
// gateway lowers the request's own cap field to it before the request reaches a
// replica, and says so in HeaderBudgetCapped. A cap the client did not set, or set
// higher, changes no answer but where it stops; the client sees the stop as
// finish_reason "length" (stop_reason "max_tokens").

// HeaderBudgetCapped, on an answer whose request the budgets capped, names the field
// the gateway set, the value it set and the value the request asked for ("none" when
// it set none): "max_tokens=10; asked=none".
const HeaderBudgetCapped = "X-Macfleet-Budget-Capped"

// budgetAsk is what the budgets see of a request: its endpoint, its cap fields, the
// bound on its usage and its body.
type budgetAsk struct {
	endpoint string
	caps     outputCaps
	lim      metering.Limits
	body     []byte
}

// capField is the field of a request to endpoint with caps c that caps each choice's
// output, as the agent reads it (chat and text completions: max_completion_tokens
// when set, else max_tokens; Responses: max_output_tokens; Messages: max_tokens),
// and what the request set there (nil: nothing). ok is false where the gateway cannot
// cap: an endpoint that generates nothing or that it does not know, or a cap field
// the agent refuses anyway (not a positive integer).
func capField(endpoint string, c outputCaps) (field string, asked json.RawMessage, ok bool) {
	switch endpoint {
	case "chat_completions", "completions":
		field, asked = "max_tokens", c.MaxTokens
		if _, set := capOf(c.MaxCompletionTokens); set {
			field, asked = "max_completion_tokens", c.MaxCompletionTokens
		}
	case "responses":
		field, asked = "max_output_tokens", c.MaxOutputTokens
	case "messages":
		field, asked = "max_tokens", c.MaxTokens
	default:
		return "", nil, false
	}
	if n, set := capOf(asked); set && n < 1 {
		return "", nil, false
	} else if !set {
		asked = nil
	}
	return field, asked, true
}

// budgetRequest is the request a's budgets count: budget.Estimate, its output fixed
// where the gateway cannot cap it.
func budgetRequest(a budgetAsk) budget.Request {
	req := budget.Estimate(a.lim, len(a.body))
	if _, _, ok := capField(a.endpoint, a.caps); !ok {
		req = budget.Request{Prompt: req.Tokens()}
	}
	return req
}

// budgetCap is a request the budgets capped: its body with the cap set, the cap, and
// what to report.
type budgetCap struct {
	body   []byte
	n      int64
	report string
}

// capBody sets a's cap field to n tokens. The field is set in place (sjson); the
// result is read back as the agent reads it (encoding/json: the last of duplicate
// keys, any letter case), and a body where that finds another cap is rewritten
// whole with the one field.
func capBody(a budgetAsk, n int64) (*budgetCap, error) {
	field, asked, ok := capField(a.endpoint, a.caps)
	if !ok {
		return nil, fmt.Errorf("the gateway cannot cap the output of a request to %s", a.endpoint)
	}
	was := "none"
	if asked != nil {
		was = strings.TrimSpace(string(asked))
	}
	c := &budgetCap{n: n, report: field + "=" + strconv.FormatInt(n, 10) + "; asked=" + was}
	out, err := sjson.SetBytes(a.body, field, n)
	if err == nil && capReads(a.endpoint, out, n) {
		c.body = out
		return c, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(a.body, &m); err != nil {
		return nil, fmt.Errorf("reading the request to cap its %s: %w", field, err)
	}
	for k := range m {
		if strings.EqualFold(k, field) {
			delete(m, k)
		}
	}
	m[field] = json.RawMessage(strconv.FormatInt(n, 10))
	if out, err = json.Marshal(m); err != nil || !capReads(a.endpoint, out, n) {
		return nil, fmt.Errorf("the request's %s could not be capped at %d", field, n)
	}
	c.body = out
	return c, nil
}

// capReads is whether body, read as the agent reads it, caps each choice of a
// request to endpoint at n.
func capReads(endpoint string, body []byte, n int64) bool {
	var c outputCaps
	if json.Unmarshal(body, &c) != nil {
		return false
	}
	_, asked, ok := capField(endpoint, c)
	got, set := capOf(asked)
	return ok && set && got == n
}

// capRequest caps a's output at n a choice for the budgets: the body to send, the
// bound on its usage, and HeaderBudgetCapped on w's answer.
func capRequest(w http.ResponseWriter, a budgetAsk, n int64) ([]byte, metering.Limits, error) {
	c, err := capBody(a, n)
	if err != nil {
		return nil, a.lim, err
	}
	a.lim.MaxTokens = n
	w.Header().Set(HeaderBudgetCapped, c.report)
	return c.body, a.lim, nil
}
