package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"

	runnerapi "github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/splice"
)

// outputCaps are the request fields that cap each choice's output; which one counts
// depends on the API (usageLimits).
type outputCaps struct {
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	MaxOutputTokens     json.RawMessage `json:"max_output_tokens"`
}

// capOf is a cap field's positive count; ok false when the field is absent or null.
// A value the agent refuses (not a positive integer) is a cap of 0: no answer, and
// so no usage, follows it.
func capOf(raw json.RawMessage) (n int64, ok bool) {
	s := strings.TrimSpace(string(raw))
	if s == "" || s == "null" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return 0, true
	}
	return n, true
}

// firstCap is the first of the fields that is set, as the agent reads them (chat and
// text completions: max_completion_tokens, else max_tokens); 0 when none is.
func firstCap(fields ...json.RawMessage) int64 {
	for _, f := range fields {
		if n, ok := capOf(f); ok {
			return n
		}
	}
	return 0
}

// usageLimits is the most a request to endpoint can use, as the agent and its runner
// serve it, but for the replica's context (set per attempt): a chat or text
// completion runs n choices capped by max_completion_tokens or max_tokens; a
// Responses request one, capped by max_output_tokens; an Anthropic message one,
// capped by max_tokens; embeddings one sequence per input and generate nothing;
// count_tokens runs none. An unknown endpoint is bounded as a generation of n
// choices without a cap.
func usageLimits(endpoint string, head requestHead, body []byte) metering.Limits {
	c := head.caps
	switch endpoint {
	case "chat_completions", "completions":
		return metering.Limits{Sequences: int64(head.N), MaxTokens: firstCap(c.MaxCompletionTokens, c.MaxTokens), Generates: true}
	case "responses":
		return metering.Limits{Sequences: 1, MaxTokens: firstCap(c.MaxOutputTokens), Generates: true}
	case "messages":
		return metering.Limits{Sequences: 1, MaxTokens: firstCap(c.MaxTokens), Generates: true}
	case "embeddings":
		var req struct {
			Input *runnerapi.Input `json:"input"`
		}
		if json.Unmarshal(body, &req) != nil || req.Input == nil {
			return metering.Limits{} // the agent's 400: no usage
		}
		return metering.Limits{Sequences: int64(req.Input.Len())}
	case "messages_count_tokens":
		return metering.Limits{}
	}
	return metering.Limits{Sequences: int64(head.N), Generates: true}
}

// meter counts the usage a replica reported in resp's trailer (read at EOF) for the
// request's caller. The report is the Mac's claim: it is cut to what the request
// could use on that replica (lim with the replica's context), and a report that
// cannot be read counts nothing. Either is counted in
// macfleet_gateway_usage_clamped_total and logged at the first time only (a
// compromised Mac would fill the log).
func (g *Gateway) meter(r *http.Request, model string, be Backend, lim metering.Limits, resp *http.Response) *metering.Usage {
	v := resp.Trailer.Get(metering.Header)
	if v == "" {
		return nil
	}
	u, err := metering.Parse(v)
	if err != nil {
		g.metrics.usageClamped.WithLabelValues(model, metering.ClampUnreadable).Inc()
		g.distrusted(model, be, "A replica reported unreadable usage; not counted", "err", err.Error())
		return nil
	}
	return g.meterClaim(r, model, be, lim, u, resp.Body)
}

// meterClaim counts usage u, claimed for replica be's answer, for the request's
// caller, cut to what the request could use on that replica; body, when not nil, is
// the answer's body, whose stream the gateway counted (checkCount, choiceUsage).
func (g *Gateway) meterClaim(r *http.Request, model string, be Backend, lim metering.Limits, u metering.Usage, body io.Reader) *metering.Usage {
	lim.Context = int64(be.Context)
	bound := lim.Bound()
	claimed := u
	u, cut := metering.Clamp(u, bound)
	for _, reason := range cut {
		g.metrics.usageClamped.WithLabelValues(model, reason).Inc()
	}
	if len(cut) > 0 {
		g.distrusted(model, be, "A replica reported more usage than the request could use; counted at the bound",
			"reported", claimed.String(), "bound", bound.String(), "reasons", cut)
	}
	if body != nil {
		g.checkCount(model, be, body, &u)
		if !splice.ChoiceUsage(body, &u, bound) {
			return &u // one choice's continuation: metered with the last one
		}
	}
	id := g.caller(r)
	g.metrics.usage.Record(id, model, u)
	if g.opts.Budgets != nil {
		g.opts.Budgets.Record(id, model, u)
	}
	return &u
}

// distrusted logs a usage report the gateway cut or refused: the first one at Info,
// the next ones at V(1) (the metric counts them all).
func (g *Gateway) distrusted(model string, be Backend, msg string, kv ...any) {
	log := g.log.V(1)
	if g.usageLogged.CompareAndSwap(false, true) {
		log = g.log
		msg += " (further ones are counted in macfleet_gateway_usage_clamped_total, logged at V(1))"
	}
	log.Info(msg, append([]any{"model", model, "replica", be.Key, "node", be.Node}, kv...)...)
}

// checkCount holds a stream's usage report u against the gateway's own count of the
// tokens it forwarded (body is the stream's splice reader): a report of other
// completion tokens is counted in usage_count_disagreements_total and logged as
// distrusted. The report stays what is metered, within its bound.
func (g *Gateway) checkCount(model string, be Backend, body io.Reader, u *metering.Usage) {
	counted, ok := splice.Counted(body)
	if !ok || u == nil || counted == u.Output {
		return
	}
	g.metrics.countDisagreements.WithLabelValues(model).Inc()
	g.distrusted(model, be, "A replica reported other completion tokens than the gateway counted in its stream",
		"reported", u.Output, "counted", counted)
}
