package fairqueue

import (
	"testing"
	"time"
)

func TestRate(t *testing.T) {
	var r Rate
	if got := r.PerSecond(t0); got != 0 {
		t.Fatalf("empty rate = %v", got)
	}
	for i := range 20 { // 20 dispatches over 2 s
		r.Observe(t0.Add(time.Duration(i) * 100 * time.Millisecond))
	}
	if got := r.PerSecond(t0.Add(2 * time.Second)); got != 2 {
		t.Errorf("rate after 20 in 2 s = %v/s over the 10 s window, want 2", got)
	}
	if got := r.PerSecond(t0.Add(9 * time.Second)); got != 2 {
		t.Errorf("rate 9 s later = %v, want 2 (still in the window)", got)
	}
	r.Observe(t0.Add(10 * time.Second))
	if got := r.PerSecond(t0.Add(10 * time.Second)); got != 1.1 {
		t.Errorf("rate once the first second left the window = %v, want 1.1", got)
	}
	r.Observe(t0) // a clock that stepped back counts in the newest bucket
	if got := r.PerSecond(t0.Add(10 * time.Second)); got != 1.2 {
		t.Errorf("rate after a step back = %v, want 1.2", got)
	}
	if got := r.PerSecond(t0.Add(time.Hour)); got != 0 {
		t.Errorf("rate an hour later = %v, want 0", got)
	}
}

func TestRetryAfter(t *testing.T) {
	for _, tt := range []struct {
		ahead     int
		perSecond float64
		fallback  time.Duration
		want      time.Duration
	}{
		{ahead: 9, perSecond: 2, want: 5 * time.Second},
		{ahead: 10, perSecond: 2, want: 6 * time.Second},
		{ahead: 0, perSecond: 100, want: MinRetryAfter},
		{ahead: 1000, perSecond: 0.5, want: MaxRetryAfter},
		{ahead: 3, perSecond: 0, fallback: 5 * time.Second, want: 5 * time.Second},
		{ahead: 3, perSecond: 0, fallback: 0, want: MinRetryAfter},
		{ahead: 3, perSecond: 0, fallback: time.Hour, want: MaxRetryAfter},
	} {
		if got := RetryAfter(tt.ahead, tt.perSecond, tt.fallback); got != tt.want {
			t.Errorf("RetryAfter(%d, %v, %v) = %v, want %v", tt.ahead, tt.perSecond, tt.fallback, got, tt.want)
		}
	}
}
