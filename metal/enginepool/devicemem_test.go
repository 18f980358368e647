package enginepool

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/macfleet/macfleet/internal/devicegauge"
)

// cardReadings answers each Cards call with the next used figure (the last repeats);
// a negative figure is a failed reading.
type cardReadings struct {
	used  []int64
	calls int
}

func (c *cardReadings) Cards(context.Context) ([]devicegauge.Card, error) {
	u := c.used[min(c.calls, len(c.used)-1)]
	c.calls++
	if u < 0 {
		return nil, errors.New("the driver did not answer")
	}
	return []devicegauge.Card{{Name: "card", TotalBytes: 80 << 30, UsedBytes: u}}, nil
}

func TestDeviceFreed(t *testing.T) {
	const gib = int64(1) << 30
	for _, tc := range []struct {
		name      string
		readings  []int64
		attempts  int
		want      int64
		wantCalls int
	}{
		{name: "released at once", readings: []int64{1 * gib, 1 * gib}, attempts: 8, want: 4 * gib, wantCalls: 2},
		{name: "released over three readings", readings: []int64{4 * gib, 2 * gib, 1 * gib, 1 * gib}, attempts: 8, want: 4 * gib, wantCalls: 4},
		{name: "still falling when attempts run out", readings: []int64{4 * gib, 3 * gib, 2 * gib}, attempts: 3, want: 3 * gib, wantCalls: 3},
		{name: "another process allocated meanwhile", readings: []int64{6 * gib, 6 * gib}, attempts: 8, want: 0, wantCalls: 2},
		{name: "the driver fails after stopping", readings: []int64{-1}, attempts: 8, want: 0, wantCalls: 1},
		{name: "fails on the second reading", readings: []int64{2 * gib, -1}, attempts: 8, want: 3 * gib, wantCalls: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &cardReadings{used: tc.readings}
			var waited time.Duration
			got := deviceFreed(context.Background(), g, 5*gib, func(d time.Duration) { waited += d }, 250*time.Millisecond, tc.attempts)
			if got != tc.want || g.calls != tc.wantCalls {
				t.Errorf("freed %d after %d readings, want %d after %d", got, g.calls, tc.want, tc.wantCalls)
			}
			if maxWait := time.Duration(tc.attempts) * 250 * time.Millisecond; waited > maxWait {
				t.Errorf("waited %v, more than %d intervals", waited, tc.attempts)
			}
		})
	}
	if _, ok := deviceBefore(context.Background(), nil); ok {
		t.Error("a pool without a device gauge read a device")
	}
	if used, ok := deviceBefore(context.Background(), &cardReadings{used: []int64{3 * gib}}); !ok || used != 3*gib {
		t.Errorf("deviceBefore = %d, %v", used, ok)
	}
}
