// Command promcheck checks the chart's Prometheus rules and Grafana dashboard queries
// with Prometheus's own rule-file and PromQL parsers — what `promtool check rules` runs
// — so that `make verify` fails on a rule or query Prometheus would refuse. It reads
// the manifests `helm template` renders with monitoring on, from a file or stdin.
//
// It is a module of its own so that Prometheus and its dependencies stay out of
// macfleet's module graph. Which metrics the queries use is checked against the
// components' registries by test/chart (TestMonitoringMetricsExported).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

func main() {
	in := io.Reader(os.Stdin)
	if len(os.Args) > 1 {
		f, err := os.Open(os.Args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, "promcheck:", err)
			os.Exit(2)
		}
		defer f.Close()
		in = f
	}
	rules, queries, errs := check(in)
	for _, err := range errs {
		fmt.Fprintln(os.Stderr, "promcheck:", err)
	}
	if len(errs) > 0 || rules == 0 || queries == 0 {
		if rules == 0 || queries == 0 {
			fmt.Fprintf(os.Stderr, "promcheck: found %d rules and %d dashboard queries; render the chart with monitoring on\n", rules, queries)
		}
		os.Exit(1)
	}
	fmt.Printf("promcheck: %d rules and %d dashboard queries parse\n", rules, queries)
}

// object is the part of a manifest promcheck reads.
type object struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Spec yaml.Node         `yaml:"spec"`
	Data map[string]string `yaml:"data"`
}

// check parses every PrometheusRule and dashboard ConfigMap of a manifest stream and
// returns how many rules and queries it checked and what is wrong.
func check(in io.Reader) (rules, queries int, errs []error) {
	p := parser.NewParser(parser.Options{})
	dec := yaml.NewDecoder(in)
	for {
		var o object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return rules, queries, errs
		}
		if err != nil {
			return rules, queries, append(errs, fmt.Errorf("reading the manifests: %w", err))
		}
		switch {
		case o.Kind == "PrometheusRule":
			// The spec of a PrometheusRule is a Prometheus rule file: groups of rules.
			b, err := yaml.Marshal(&o.Spec)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			groups, perrs := rulefmt.Parse(b, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
			for _, e := range perrs {
				errs = append(errs, fmt.Errorf("PrometheusRule %s: %w", o.Metadata.Name, e))
			}
			if groups != nil {
				for _, g := range groups.Groups {
					rules += len(g.Rules)
				}
			}
		case o.Kind == "ConfigMap" && o.Metadata.Labels["grafana_dashboard"] != "":
			for file, text := range o.Data {
				n, derrs := checkDashboard(p, text)
				queries += n
				for _, e := range derrs {
					errs = append(errs, fmt.Errorf("dashboard %s: %w", file, e))
				}
			}
		}
	}
}

type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

type dashboard struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// grafanaVars are Grafana's variables in a query: $name, ${name} and ${name:format}.
var grafanaVars = regexp.MustCompile(`\$\{[A-Za-z0-9_]+(:[a-z]+)?\}|\$[A-Za-z_][A-Za-z0-9_]*`)

// builtins stand for Grafana's interval variables; other variables become label values.
var builtins = map[string]string{"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "${__rate_interval}": "5m"}

func substitute(q string) string {
	return grafanaVars.ReplaceAllStringFunc(q, func(v string) string {
		if d, ok := builtins[v]; ok {
			return d
		}
		return "grafana_variable"
	})
}

var labelValues = regexp.MustCompile(`^label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\)$`)

func checkDashboard(p parser.Parser, text string) (int, []error) {
	var d dashboard
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	if err := dec.Decode(&d); err != nil {
		return 0, []error{err}
	}
	n := 0
	var errs []error
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, pn := range ps {
			for _, tg := range pn.Targets {
				n++
				if _, err := p.ParseExpr(substitute(tg.Expr)); err != nil {
					errs = append(errs, fmt.Errorf("panel %q: %q: %w", pn.Title, tg.Expr, err))
				}
			}
			walk(pn.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		n++
		sm := labelValues.FindStringSubmatch(strings.TrimSpace(q))
		if sm == nil {
			errs = append(errs, fmt.Errorf("variable %s: %q is not label_values(<selector>, <label>)", v.Name, q))
			continue
		}
		if _, err := p.ParseMetricSelector(substitute(sm[1])); err != nil {
			errs = append(errs, fmt.Errorf("variable %s: %q: %w", v.Name, q, err))
		}
	}
	return n, errs
}
