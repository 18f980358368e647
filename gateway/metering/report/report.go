// Package report reads the gateways' usage ledger back: the TokenUsage objects each
// gateway replica keeps per namespace and UTC day, summed over the replicas, per day
// and per key (and per deployment when asked), as `macfleet usage` prints it and the
// console's usage page shows it.
//
// Aggregate is pure: TokenUsage objects and a Query go in, sorted rows come out. Run
// lists the objects with the caller's own credentials, in one namespace unless every
// namespace is asked for, so a team with RBAC on its namespace alone reads its usage.
package report

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/metering"
)

// DayLayout is how a TokenUsage names its UTC day.
const DayLayout = "2006-01-02"

// Query says which usage to add up and how finely.
type Query struct {
	// Namespace keeps only its TokenUsages; "" keeps every namespace's.
	Namespace string
	// From and To are the first and last UTC day counted (YYYY-MM-DD), both included;
	// "" leaves that end open.
	From, To string
	// ByDeployment gives a row per deployment of each key instead of one per key.
	ByDeployment bool
}

// Row is one day's usage of one key (and one deployment with ByDeployment), summed
// over the gateway replicas that counted it.
type Row struct {
	Day, Namespace, Key string
	// Deployment is the deployment answered (namespace/name); "" without ByDeployment.
	Deployment                                        string
	Requests, InputTokens, CachedTokens, OutputTokens int64
}

// add counts u into r, each count saturating at metering.MaxCount.
func (r *Row) add(u mfv1.KeyUsage) {
	r.Requests = metering.AddCount(r.Requests, u.Requests)
	r.InputTokens = metering.AddCount(r.InputTokens, u.InputTokens)
	r.CachedTokens = metering.AddCount(r.CachedTokens, u.CachedTokens)
	r.OutputTokens = metering.AddCount(r.OutputTokens, u.OutputTokens)
}

// Aggregate sums the usage records that q selects over the gateway replicas that
// wrote them, into rows sorted by day, namespace, key and deployment.
func Aggregate(items []mfv1.TokenUsage, q Query) []Row {
	type id struct{ day, ns, key, dep string }
	sums := map[id]*Row{}
	for _, tu := range items {
		day := tu.Spec.Day
		if (q.Namespace != "" && tu.Namespace != q.Namespace) || (q.From != "" && day < q.From) || (q.To != "" && day > q.To) {
			continue
		}
		for _, u := range tu.Spec.Usage {
			k := id{day, tu.Namespace, u.Key, ""}
			if q.ByDeployment {
				k.dep = u.Deployment
			}
			r := sums[k]
			if r == nil {
				r = &Row{Day: day, Namespace: tu.Namespace, Key: u.Key, Deployment: k.dep}
				sums[k] = r
			}
			r.add(u)
		}
	}
	rows := make([]Row, 0, len(sums))
	for _, r := range sums {
		rows = append(rows, *r)
	}
	slices.SortFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.Day, b.Day), cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Key, b.Key), cmp.Compare(a.Deployment, b.Deployment))
	})
	return rows
}

// Total adds rows up (its Day, Namespace, Key and Deployment are empty).
func Total(rows []Row) Row {
	var t Row
	for _, r := range rows {
		t.add(mfv1.KeyUsage{Requests: r.Requests, InputTokens: r.InputTokens, CachedTokens: r.CachedTokens, OutputTokens: r.OutputTokens})
	}
	return t
}

// Days is the range of the last n UTC days up to now's, today included; since, when
// set (YYYY-MM-DD), is the first day instead.
func Days(now time.Time, n int, since string) (from, to string, err error) {
	today := now.UTC().Truncate(24 * time.Hour)
	to = today.Format(DayLayout)
	if since != "" {
		d, err := time.Parse(DayLayout, since)
		if err != nil {
			return "", "", fmt.Errorf("--since %q: want a UTC day as YYYY-MM-DD", since)
		}
		if d.After(today) {
			return "", "", fmt.Errorf("--since %s is after today (%s, UTC)", since, to)
		}
		return since, to, nil
	}
	if n < 1 {
		return "", "", fmt.Errorf("--days %d: count at least 1 day (today)", n)
	}
	return today.AddDate(0, 0, -(n - 1)).Format(DayLayout), to, nil
}
