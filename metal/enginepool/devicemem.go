package enginepool

import (
	"context"
	"time"

	"github.com/macfleet/macfleet/internal/devicegauge"
)

// An unload's freed device memory, on a machine whose accelerators have memory of
// their own (docs/architecture.md, "Two memory domains"). The host gauge settles the
// footprint; the cards are read from their driver before the runner stops and after it
// is gone, so that the report holds what the card got back — the runner's buffers, its
// CUDA context and the backend's pool alike — not what the runner said it held.

// deviceBefore reads the cards' used memory before a runner stops: ok false where the
// pool has no device gauge (a Mac) or the reading failed.
func deviceBefore(ctx context.Context, g devicegauge.Gauge) (used int64, ok bool) {
	if g == nil {
		return 0, false
	}
	cards, err := g.Cards(ctx)
	if err != nil || len(cards) == 0 {
		return 0, false
	}
	return devicegauge.Used(cards), true
}

// deviceSettleInterval spaces the cards' readings after a runner is reaped. The
// driver releases a process's memory as the process goes, so by the first reading the
// drop is normally whole and the second only confirms it; spaced at the host
// barrier's 250 ms that confirmation made an unload 1.7x slower than the peer's on an
// H100. A reading through the driver's tool itself takes tens of milliseconds.
const deviceSettleInterval = 50 * time.Millisecond

// deviceFreed is how far the cards' used memory fell from before: read every interval
// until two readings agree within slack (the driver has finished releasing the
// process's memory) or attempts run out. Never negative: another process allocating
// meanwhile shows as nothing freed, not as a debt.
func deviceFreed(ctx context.Context, g devicegauge.Gauge, before int64, wait func(time.Duration), interval time.Duration,
	attempts int) int64 {
	const slack = 1 << 20
	last := int64(-1)
	for range max(attempts, 1) {
		cards, err := g.Cards(ctx)
		if err != nil {
			break
		}
		used := devicegauge.Used(cards)
		if last >= 0 && abs64(used-last) <= slack {
			last = used
			break
		}
		last = used
		wait(interval)
	}
	if last < 0 {
		return 0
	}
	return max(before-last, 0)
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
