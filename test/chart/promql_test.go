package chart

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The chart's PromQL is read here by a small tokenizer, to find the metric names each
// query uses; the Prometheus parser itself checks every rule and query in `make verify`
// (hack/promcheck, a module of its own, since Prometheus would otherwise join this
// module's graph). The tokenizer also catches what a typo most often breaks:
// unbalanced brackets, unterminated strings, and unknown functions.

// promqlFunctions are PromQL's functions and aggregation operators, as the chart may
// call them; a name followed by "(" that is not here fails the test, so a misspelt
// function is found, and a new one must be added here.
var promqlFunctions = set(
	"abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min",
	"count_over_time", "delta", "deriv", "exp", "floor", "histogram_quantile", "idelta", "increase", "irate",
	"label_join", "label_replace", "last_over_time", "ln", "log2", "log10", "max_over_time", "min_over_time",
	"predict_linear", "present_over_time", "quantile_over_time", "rate", "resets", "round", "scalar", "sgn", "sort",
	"sort_desc", "sqrt", "stddev_over_time", "sum_over_time", "time", "timestamp", "vector",
	// Aggregation operators.
	"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
)

// promqlLabelLists are keywords followed by a parenthesized list of label names.
var promqlLabelLists = set("by", "without", "on", "ignoring", "group_left", "group_right")

// promqlKeywords are the other words that are not metric names.
var promqlKeywords = set("and", "or", "unless", "offset", "bool", "atan2", "inf", "nan")

func set(words ...string) map[string]bool {
	m := make(map[string]bool, len(words))
	for _, w := range words {
		m[w] = true
	}
	return m
}

// metricNames returns the metric names expr selects, in order of appearance, or an
// error when expr is malformed. Grafana variables ($model, ${mac}, $__rate_interval)
// are skipped.
func metricNames(expr string) ([]string, error) {
	var names []string
	var open []byte // "(" not yet closed
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(expr, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '{' || c == '[':
			end, err := skipGroup(expr, i)
			if err != nil {
				return nil, err
			}
			// A name matched as a label would escape the check of the names.
			if strings.Contains(expr[i:end], "__name__") {
				return nil, fmt.Errorf("a metric selected by __name__ at %d: name it instead", i)
			}
			i = end
		case c == '(':
			open = append(open, c)
			i++
		case c == ')':
			if len(open) == 0 {
				return nil, fmt.Errorf("unbalanced ) at %d", i)
			}
			open = open[:len(open)-1]
			i++
		case c == '}' || c == ']':
			return nil, fmt.Errorf("unbalanced %c at %d", c, i)
		case c == '$':
			i = skipVariable(expr, i)
		case isDigit(c) || c == '.':
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			end := i
			for end < len(expr) && isIdent(expr[end]) {
				end++
			}
			word, next := expr[i:end], nextByte(expr, end)
			switch {
			case promqlLabelLists[strings.ToLower(word)]:
				if next == '(' {
					start := strings.IndexByte(expr[end:], '(') + end
					close := strings.IndexByte(expr[start:], ')')
					if close < 0 {
						return nil, fmt.Errorf("unclosed label list after %s", word)
					}
					end = start + close + 1
				}
			case promqlKeywords[strings.ToLower(word)]:
			case promqlFunctions[word] && promqlLabelLists[nextWord(expr, end)]:
				// An aggregation with its grouping first: sum by (x) (...).
			case next == '(':
				if !promqlFunctions[word] {
					return nil, fmt.Errorf("unknown function %s", word)
				}
			default:
				names = append(names, word)
			}
			i = end
		default:
			i++
		}
	}
	if len(open) > 0 {
		return nil, fmt.Errorf("%d unclosed (", len(open))
	}
	return names, nil
}

// skipString returns the index after the string literal that starts at expr[i].
func skipString(expr string, i int) (int, error) {
	q := expr[i]
	for j := i + 1; j < len(expr); j++ {
		switch {
		case expr[j] == '\\' && q != '`':
			j++
		case expr[j] == q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at %d", i)
}

// skipGroup returns the index after the label matchers ({...}) or the range or
// subquery ([...]) that starts at expr[i]; neither holds metric names.
func skipGroup(expr string, i int) (int, error) {
	closing := byte('}')
	if expr[i] == '[' {
		closing = ']'
	}
	for j := i + 1; j < len(expr); j++ {
		switch c := expr[j]; {
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(expr, j)
			if err != nil {
				return 0, err
			}
			j = end - 1
		case c == closing:
			return j + 1, nil
		case c == '{' || c == '}' || c == '[' || c == ']' || c == '(' || c == ')':
			return 0, fmt.Errorf("unexpected %c at %d inside %c", c, j, expr[i])
		}
	}
	return 0, fmt.Errorf("unclosed %c at %d", expr[i], i)
}

// skipVariable returns the index after the Grafana variable ($name or ${name}) at expr[i].
func skipVariable(expr string, i int) int {
	i++
	if i < len(expr) && expr[i] == '{' {
		if end := strings.IndexByte(expr[i:], '}'); end >= 0 {
			return i + end + 1
		}
	}
	for i < len(expr) && isIdent(expr[i]) {
		i++
	}
	return i
}

func nextByte(s string, i int) byte {
	for ; i < len(s); i++ {
		if s[i] != ' ' && s[i] != '\t' && s[i] != '\n' {
			return s[i]
		}
	}
	return 0
}

// nextWord returns the identifier after s[i:] and blanks, if any.
func nextWord(s string, i int) string {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n') {
		i++
	}
	end := i
	for end < len(s) && isIdent(s[end]) {
		end++
	}
	return strings.ToLower(s[i:end])
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}
func isIdent(c byte) bool { return isIdentStart(c) || isDigit(c) }

func TestMonitoringPromQLTokenizer(t *testing.T) {
	tests := []struct {
		expr    string
		want    []string
		wantErr string
	}{
		{expr: `up{job="macfleet-agents"} == 0`, want: []string{"up"}},
		{expr: `sum by (model, le) (rate(a_bucket{model=~"$model", code=~"5.."}[$__rate_interval]))`, want: []string{"a_bucket"}},
		{expr: "histogram_quantile(0.99, sum without(instance) (rate(x_bucket[5m]))) > 10", want: []string{"x_bucket"}},
		{expr: "a / on (instance) group_left sum by (instance) (b) and ignoring(x) c offset 5m", want: []string{"a", "b", "c"}},
		{expr: `min_over_time(sum(q)[15m:1m]) > bool 1e3`, want: []string{"q"}},
		{expr: `label_replace(v, "dst", "$1", "src", "(.*)")`, want: []string{"v"}},
		{expr: `{__name__="x"}`, wantErr: "__name__"},
		{expr: `rat(x[5m])`, wantErr: "unknown function rat"},
		{expr: `sum(rate(x[5m])`, wantErr: "unclosed ("},
		{expr: `x{a="b}`, wantErr: "unterminated string"},
		{expr: `x{a="b"`, wantErr: "unclosed {"},
		{expr: `rate(x[5m)`, wantErr: "inside ["},
		{expr: `x)`, wantErr: "unbalanced )"},
	}
	for _, tc := range tests {
		got, err := metricNames(tc.expr)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("metricNames(%q) error = %v, want one containing %q", tc.expr, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("metricNames(%q): %v", tc.expr, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("metricNames(%q) (-want +got):\n%s", tc.expr, diff)
		}
	}
}
