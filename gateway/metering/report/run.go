package report

import (
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

// Output formats.
const (
	Table = "table"
	CSV   = "csv"
)

// Config is what `macfleet usage` was asked.
type Config struct {
	// Namespace is read unless AllNamespaces.
	Namespace     string
	AllNamespaces bool
	ByDeployment  bool
	// Days counts back from today (UTC), today included; Since, when set, is the first
	// day instead.
	Days  int
	Since string
	// Output is Table (aligned columns and a total) or CSV (a header and the rows).
	Output string
	Now    time.Time
}

// Run lists the TokenUsages cfg asks for with c and writes their rows to w.
func Run(ctx context.Context, c client.Reader, cfg Config, w io.Writer) error {
	if cfg.Output != Table && cfg.Output != CSV {
		return fmt.Errorf("-o %q: want %s or %s", cfg.Output, Table, CSV)
	}
	if !cfg.AllNamespaces && cfg.Namespace == "" {
		return fmt.Errorf("no namespace: pass -n NAMESPACE, or -A for every namespace")
	}
	from, to, err := Days(cfg.Now, cfg.Days, cfg.Since)
	if err != nil {
		return err
	}
	var list mfv1.TokenUsageList
	var opts []client.ListOption
	where := "every namespace"
	if !cfg.AllNamespaces {
		opts = append(opts, client.InNamespace(cfg.Namespace))
		where = "namespace " + cfg.Namespace
	}
	if err := c.List(ctx, &list, opts...); err != nil {
		if apierrors.IsForbidden(err) && cfg.AllNamespaces {
			return fmt.Errorf("listing TokenUsages in every namespace: %w (with access to one namespace only, pass -n NAMESPACE)", err)
		}
		return fmt.Errorf("listing TokenUsages in %s: %w", where, err)
	}
	q := Query{From: from, To: to, ByDeployment: cfg.ByDeployment}
	if !cfg.AllNamespaces {
		q.Namespace = cfg.Namespace
	}
	rows := Aggregate(list.Items, q)
	cols := columns(cfg.AllNamespaces, cfg.ByDeployment)
	if cfg.Output == CSV {
		return writeCSV(w, cols, rows)
	}
	if len(rows) == 0 {
		_, err := fmt.Fprintf(w, "No usage recorded in %s from %s to %s (UTC).\n", where, from, to)
		return err
	}
	return writeTable(w, cols, rows)
}

// column is one column of the output: its CSV and table headers and its cell.
type column struct {
	csv, table string
	cell       func(Row) string
	number     bool
}

func columns(namespaces, deployments bool) []column {
	n := func(f func(Row) int64) func(Row) string {
		return func(r Row) string { return strconv.FormatInt(f(r), 10) }
	}
	cols := []column{{csv: "day", table: "DAY", cell: func(r Row) string { return r.Day }}}
	if namespaces {
		cols = append(cols, column{csv: "namespace", table: "NAMESPACE", cell: func(r Row) string { return r.Namespace }})
	}
	cols = append(cols, column{csv: "key", table: "KEY", cell: func(r Row) string { return r.Key }})
	if deployments {
		cols = append(cols, column{csv: "deployment", table: "DEPLOYMENT", cell: func(r Row) string { return r.Deployment }})
	}
	return append(cols,
		column{csv: "requests", table: "REQUESTS", number: true, cell: n(func(r Row) int64 { return r.Requests })},
		column{csv: "input_tokens", table: "INPUT", number: true, cell: n(func(r Row) int64 { return r.InputTokens })},
		column{csv: "cached_tokens", table: "CACHED", number: true, cell: n(func(r Row) int64 { return r.CachedTokens })},
		column{csv: "output_tokens", table: "OUTPUT", number: true, cell: n(func(r Row) int64 { return r.OutputTokens })},
	)
}

func writeCSV(w io.Writer, cols []column, rows []Row) error {
	cw := csv.NewWriter(w)
	rec := make([]string, len(cols))
	for i, c := range cols {
		rec[i] = c.csv
	}
	if err := cw.Write(rec); err != nil {
		return err
	}
	for _, r := range rows {
		for i, c := range cols {
			rec[i] = c.cell(r)
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// writeTable aligns the columns, text to the left and numbers to the right, and ends
// with the total.
func writeTable(w io.Writer, cols []column, rows []Row) error {
	total := Total(rows)
	lines := [][]string{make([]string, len(cols))}
	for i, c := range cols {
		lines[0][i] = c.table
	}
	for _, r := range rows {
		line := make([]string, len(cols))
		for i, c := range cols {
			line[i] = c.cell(r)
		}
		lines = append(lines, line)
	}
	last := make([]string, len(cols))
	last[0] = "TOTAL"
	for i, c := range cols {
		if c.number {
			last[i] = c.cell(total)
		}
	}
	lines = append(lines, last)
	width := make([]int, len(cols))
	for _, l := range lines {
		for i, s := range l {
			width[i] = max(width[i], len(s))
		}
	}
	var b strings.Builder
	for _, l := range lines {
		for i, s := range l {
			if i > 0 {
				b.WriteString("  ")
			}
			gap := strings.Repeat(" ", width[i]-len(s))
			if cols[i].number {
				b.WriteString(gap + s)
			} else {
				b.WriteString(s + gap)
			}
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
