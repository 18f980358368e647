package credentials

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestCheckNotExpired: a token that expired before the agent started is refused with
// ErrExpired and the step that gives the Mac a new credential; one still valid passes.
func TestCheckNotExpired(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := Claims{ServiceAccount: "mac-1", IssuedAt: t0, Expires: t0.Add(24 * time.Hour)}
	for _, tt := range []struct {
		name       string
		now        time.Time
		kubeconfig string
		want       []string // in the error; none: no error
	}{
		{name: "a second left", now: c.Expires.Add(-time.Second)},
		{name: "expired this instant", now: c.Expires, kubeconfig: "/Users/a/mac-1.kubeconfig",
			want: []string{"expired at 2026-01-02T00:00:00Z (0s ago)", "macfleet nodes credentials mac-1 -o mac-1.kubeconfig", "copy that file to /Users/a/mac-1.kubeconfig"}},
		{name: "three days offline, $KUBECONFIG of several files", now: t0.Add(72 * time.Hour),
			want: []string{"(48h0m0s ago)", "macfleet nodes credentials mac-1", "copy that file to the agent's --kubeconfig"}},
	} {
		err := checkNotExpired(c, tt.kubeconfig, tt.now)
		if len(tt.want) == 0 {
			if err != nil {
				t.Errorf("%s: %v, want none", tt.name, err)
			}
			continue
		}
		if !errors.Is(err, ErrExpired) {
			t.Errorf("%s: %v, want ErrExpired", tt.name, err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", tt.name, err, w)
			}
		}
	}
}
