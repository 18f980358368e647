package runnerproc

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/enginepool"
)

// TestSplitArgs: a split head's runner gets one --split-worker/--split-layers pair per
// worker in layer order, and its sandbox the loopback ports of those workers only.
func TestSplitArgs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		workers   []enginepool.SplitWorker
		wantArgs  []string
		wantPorts []uint16
	}{
		{name: "not split"},
		{name: "two workers in layer order",
			workers:   []enginepool.SplitWorker{{Addr: "127.0.0.1:40001", Layers: 10}, {Addr: "127.0.0.1:40002", Layers: 6}},
			wantArgs:  []string{"--split-worker", "127.0.0.1:40001", "--split-layers", "10", "--split-worker", "127.0.0.1:40002", "--split-layers", "6"},
			wantPorts: []uint16{40001, 40002}},
		{name: "a worker elsewhere than loopback opens no port",
			workers:  []enginepool.SplitWorker{{Addr: "10.0.0.2:7070", Layers: 4}, {Addr: "mac2:7070", Layers: 4}},
			wantArgs: []string{"--split-worker", "10.0.0.2:7070", "--split-layers", "4", "--split-worker", "mac2:7070", "--split-layers", "4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.wantArgs, splitArgs(tc.workers)); d != "" {
				t.Errorf("splitArgs (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.wantPorts, splitPorts(tc.workers)); d != "" {
				t.Errorf("splitPorts (-want +got):\n%s", d)
			}
		})
	}
}
