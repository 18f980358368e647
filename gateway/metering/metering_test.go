package metering

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/macfleet/macfleet/gateway/tenancy"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Usage
		wantErr string
	}{
		{"input=12 cached=3 output=5", Usage{Input: 12, Cached: 3, Output: 5}, ""},
		{"output=5 input=12", Usage{Input: 12, Output: 5}, ""},
		{"input=0 cached=0 output=0", Usage{}, ""},
		{"input=1 images=4 output=2", Usage{Input: 1, Output: 2}, ""}, // a newer agent's count is skipped
		{"", Usage{}, "counts nothing"},
		{"images=4", Usage{}, "counts nothing"},
		{"input=-1", Usage{}, "not name=count"},
		{"input=x", Usage{}, "not name=count"},
		{"input", Usage{}, "not name=count"},
	} {
		got, err := Parse(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Parse(%q) = %+v, %v; want an error with %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if back, err := Parse(got.String()); err != nil || back != got {
			t.Errorf("Parse(%q.String()) = %+v, %v", got, back, err)
		}
	}
}

func TestMeterRecord(t *testing.T) {
	m := NewMeter()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.Requests, m.Tokens)
	a := tenancy.Identity{Namespace: "team-a", Name: "ci"}
	m.Record(a, "team-a/chat", Usage{Input: 10, Cached: 4, Output: 3})
	m.Record(a, "team-a/chat", Usage{Input: 7, Output: 2})
	m.Record(tenancy.Identity{Admin: true}, "team-b/chat", Usage{Input: 1, Output: 1})
	for _, tc := range []struct {
		c    prometheus.Collector
		want float64
	}{
		{m.Requests.WithLabelValues("team-a", "ci", "team-a/chat"), 2},
		{m.Tokens.WithLabelValues("team-a", "ci", "team-a/chat", TypeInput), 17},
		{m.Tokens.WithLabelValues("team-a", "ci", "team-a/chat", TypeCached), 4},
		{m.Tokens.WithLabelValues("team-a", "ci", "team-a/chat", TypeOutput), 5},
		{m.Requests.WithLabelValues("", "", "team-b/chat"), 1},
	} {
		if got := testutil.ToFloat64(tc.c); got != tc.want {
			t.Errorf("counter = %v, want %v", got, tc.want)
		}
	}
}
