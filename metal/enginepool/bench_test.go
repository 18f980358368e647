package enginepool

import (
	"context"
	"testing"

	"github.com/go-logr/logr"
	testingclock "k8s.io/utils/clock/testing"
)

// BenchmarkAcquireRelease is the pool's share of every request's latency: one lease
// on a Ready engine, taken and released from many goroutines at once.
func BenchmarkAcquireRelease(b *testing.B) {
	g := newFakeGauge(64 * gib)
	p, err := New(Config{CeilingBytes: 10 * gib, AgentPID: fakeAgentPID}, newFakeFactory(g), g,
		testingclock.NewFakeClock(epoch), logr.Discard())
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []string{"a", "b", "c"} {
		if err := p.Register(ModelSpec{Name: n, EstimatedBytes: gib}); err != nil {
			b.Fatal(err)
		}
		if err := p.Load(context.Background(), n); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l, err := p.Acquire(ctx, "b")
			if err != nil {
				b.Error(err)
				return
			}
			l.Release()
		}
	})
}
