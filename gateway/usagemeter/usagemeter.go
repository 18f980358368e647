// Package usagemeter counts the usage replicas report for the gateway's answers: a
// report is the Mac's claim, cut to what the request could use on that replica,
// held against the gateway's own count of a stream's tokens, and then counted for
// the caller in the usage metrics and, for a team's caller, in its budgets' ledger.
package usagemeter

import (
	"io"
	"net/http"
	"sync/atomic"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/macfleet/macfleet/gateway/metering"
	"github.com/macfleet/macfleet/gateway/routing"
	"github.com/macfleet/macfleet/gateway/splice"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

// Metrics are the series the meter counts in: the usage per key, namespace and
// deployment, the reports cut to their bound or refused (Clamped), and the streams
// whose report is not the gateway's own count (Disagreements).
type Metrics struct {
	Usage         *metering.Meter
	Clamped       *prometheus.CounterVec
	Disagreements *prometheus.CounterVec
}

// Ledger records a caller's usage against its budgets (admission.Budgets).
type Ledger interface {
	Record(id tenancy.Identity, deployment string, u metering.Usage)
}

// Meter counts the usage of the gateway's answers. It logs the first report it cut
// or refused at Info, the next ones at V(1) (the metric counts them all).
type Meter struct {
	m      Metrics
	ledger Ledger // nil: no budgets
	log    logr.Logger
	// logged: a usage report was cut or refused and logged.
	logged atomic.Bool
}

// New is a meter counting in m and, when ledger is not nil, in the budgets' ledger.
func New(m Metrics, ledger Ledger, log logr.Logger) *Meter {
	return &Meter{m: m, ledger: ledger, log: log}
}

// Answer is what the meter knows of one answer: who asked, the deployment (its
// ID), the replica that answered and the most the request could use but for the
// replica's context.
type Answer struct {
	Caller  tenancy.Identity
	Model   string
	Backend routing.Backend
	Limits  metering.Limits
}

// Trailer counts the usage a replica reported in resp's trailer (read at EOF) for a.
// The report is the Mac's claim: it is cut to what the request could use on that
// replica (a's limits with the replica's context), and a report that cannot be read
// counts nothing. Either is counted in macfleet_gateway_usage_clamped_total and
// logged at the first time only (a compromised Mac would fill the log). nil: nothing
// reported, or nothing readable.
func (m *Meter) Trailer(a Answer, resp *http.Response) *metering.Usage {
	v := resp.Trailer.Get(metering.Header)
	if v == "" {
		return nil
	}
	u, err := metering.Parse(v)
	if err != nil {
		m.m.Clamped.WithLabelValues(a.Model, metering.ClampUnreadable).Inc()
		m.distrusted(a, "A replica reported unreadable usage; not counted", "err", err.Error())
		return nil
	}
	return m.Claim(a, u, resp.Body)
}

// Claim counts usage u, claimed for a's replica, for a's caller, cut to what the
// request could use on that replica; body, when not nil, is the answer's body, whose
// stream the gateway counted (checkCount, splice.ChoiceUsage).
func (m *Meter) Claim(a Answer, u metering.Usage, body io.Reader) *metering.Usage {
	lim := a.Limits
	lim.Context = int64(a.Backend.Context)
	bound := lim.Bound()
	claimed := u
	u, cut := metering.Clamp(u, bound)
	for _, reason := range cut {
		m.m.Clamped.WithLabelValues(a.Model, reason).Inc()
	}
	if len(cut) > 0 {
		m.distrusted(a, "A replica reported more usage than the request could use; counted at the bound",
			"reported", claimed.String(), "bound", bound.String(), "reasons", cut)
	}
	if body != nil {
		m.checkCount(a, body, &u)
		if !splice.ChoiceUsage(body, &u, bound) {
			return &u // one choice's continuation: metered with the last one
		}
	}
	m.m.Usage.Record(a.Caller, a.Model, u)
	if m.ledger != nil {
		m.ledger.Record(a.Caller, a.Model, u)
	}
	return &u
}

// distrusted logs a usage report the meter cut or refused: the first one at Info,
// the next ones at V(1) (the metric counts them all).
func (m *Meter) distrusted(a Answer, msg string, kv ...any) {
	log := m.log.V(1)
	if m.logged.CompareAndSwap(false, true) {
		log = m.log
		msg += " (further ones are counted in macfleet_gateway_usage_clamped_total, logged at V(1))"
	}
	be := a.Backend
	log.Info(msg, append([]any{"model", a.Model, "replica", be.Key, "node", be.Node}, kv...)...)
}

// checkCount holds a stream's usage report u against the gateway's own count of the
// tokens it forwarded (body is the stream's splice reader): a report of other
// completion tokens is counted in usage_count_disagreements_total and logged as
// distrusted. The report stays what is metered, within its bound.
func (m *Meter) checkCount(a Answer, body io.Reader, u *metering.Usage) {
	counted, ok := splice.Counted(body)
	if !ok || u == nil || counted == u.Output {
		return
	}
	m.m.Disagreements.WithLabelValues(a.Model).Inc()
	m.distrusted(a, "A replica reported other completion tokens than the gateway counted in its stream",
		"reported", u.Output, "counted", counted)
}
