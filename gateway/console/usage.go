package console

import (
	"slices"

	"github.com/macfleet/macfleet/gateway/metering/report"
)

// DefaultUsageDays is how many days the usage page shows unless asked (?days=).
const DefaultUsageDays = 7

// MaxUsageDays bounds ?days=.
const MaxUsageDays = 92

// UsagePage is a namespace's tokens and requests per day, key and deployment, summed
// over the gateway replicas that counted them (the TokenUsage ledgers).
type UsagePage struct {
	// Namespace is the namespace shown; "" is every namespace (admins only).
	Namespace string
	// Namespaces are those an admin may choose from (none for a team's key).
	Namespaces []string
	Days       int
	From, To   string
	Rows       []report.Row
	Total      report.Row
}

// BuildUsage is the usage page of namespace ("" for all) over the last days UTC days,
// from a scoped snapshot: a team's snapshot holds only its own namespace's ledgers.
func BuildUsage(s Snapshot, namespace string, days int) UsagePage {
	p := UsagePage{Namespace: namespace, Days: days}
	p.From, p.To, _ = report.Days(s.Now, days, "") // days is within 1..MaxUsageDays
	p.Rows = report.Aggregate(s.Usage, report.Query{Namespace: namespace, From: p.From, To: p.To, ByDeployment: true})
	p.Total = report.Total(p.Rows)
	if s.Viewer.Admin {
		seen := map[string]bool{}
		for _, u := range s.Usage {
			seen[u.Namespace] = true
		}
		for _, d := range s.Deployments {
			seen[d.Namespace] = true
		}
		for ns := range seen {
			p.Namespaces = append(p.Namespaces, ns)
		}
		slices.Sort(p.Namespaces)
	}
	return p
}
