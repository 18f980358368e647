package runnerproc

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/metal/enginepool"
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
			if d := cmp.Diff(tc.wantPorts, splitPorts(enginepool.ModelSpec{SplitWorkers: tc.workers})); d != "" {
				t.Errorf("splitPorts (-want +got):\n%s", d)
			}
		})
	}
}

// TestSplitWorkerArgs: a worker shard followed by another gets --next and may connect
// to that loopback port (the agent's peer link); the last one, neither; a head never
// takes a worker's next; every worker reads its secret from its standard input.
func TestSplitWorkerArgs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		spec      enginepool.ModelSpec
		wantNext  string
		wantPorts []uint16
	}{
		{name: "middle worker", spec: enginepool.ModelSpec{SplitWorker: true, SplitNext: "127.0.0.1:40100"},
			wantNext: "127.0.0.1:40100", wantPorts: []uint16{40100}},
		{name: "last worker", spec: enginepool.ModelSpec{SplitWorker: true}},
		{name: "a head ignores a next", spec: enginepool.ModelSpec{SplitNext: "127.0.0.1:40100",
			SplitWorkers: []enginepool.SplitWorker{{Addr: "127.0.0.1:40001", Layers: 2}}}, wantPorts: []uint16{40001}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.Name, tc.spec.Path = "m", "/models/m.gguf"
			args := NewProcessFactory(ProcessConfig{Threads: 1}).runnerArgs(tc.spec, 0, "/tmp/runner.sock", "", nil)
			next := ""
			if i := slices.Index(args, "--next"); i >= 0 && i+1 < len(args) {
				next = args[i+1]
			}
			if next != tc.wantNext {
				t.Errorf("--next %q, want %q; command line %q", next, tc.wantNext, args)
			}
			if worker := tc.spec.SplitWorker; slices.Contains(args, "--secret-stdin") != worker {
				t.Errorf("--secret-stdin in %q: want it exactly for a worker (%v)", args, worker)
			}
			if d := cmp.Diff(tc.wantPorts, splitPorts(tc.spec)); d != "" {
				t.Errorf("splitPorts (-want +got):\n%s", d)
			}
		})
	}
}

// TestSplitPipelineArgs: a split head's command line carries --split-pipeline N (after
// its workers) when the replica asks for more than one context; a whole replica's and
// a worker's never do, whatever their settings say.
func TestSplitPipelineArgs(t *testing.T) {
	workers := []enginepool.SplitWorker{{Addr: "127.0.0.1:40001", Layers: 10}}
	settings := func(pipeline int32) engine.Settings {
		return engine.Settings{ContextLength: 1024, Parallel: 4, Threads: 1, SplitPipeline: pipeline}
	}
	for _, tc := range []struct {
		name string
		spec enginepool.ModelSpec
		want []string // the command line's tail from --split-worker on; nil: no split flags
	}{
		{name: "split head, two contexts", spec: enginepool.ModelSpec{Engine: settings(2), SplitWorkers: workers},
			want: []string{"--split-worker", "127.0.0.1:40001", "--split-layers", "10", "--split-pipeline", "2"}},
		{name: "split head, four contexts", spec: enginepool.ModelSpec{Engine: settings(4), SplitWorkers: workers},
			want: []string{"--split-worker", "127.0.0.1:40001", "--split-layers", "10", "--split-pipeline", "4"}},
		{name: "split head, one context", spec: enginepool.ModelSpec{Engine: settings(1), SplitWorkers: workers},
			want: []string{"--split-worker", "127.0.0.1:40001", "--split-layers", "10"}},
		{name: "split head, unset", spec: enginepool.ModelSpec{Engine: settings(0), SplitWorkers: workers},
			want: []string{"--split-worker", "127.0.0.1:40001", "--split-layers", "10"}},
		{name: "whole replica ignores it", spec: enginepool.ModelSpec{Engine: settings(2)}},
		{name: "worker ignores it", spec: enginepool.ModelSpec{Engine: settings(2), SplitWorker: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.Name, tc.spec.Path = "m", "/models/m.gguf"
			f := NewProcessFactory(ProcessConfig{Threads: 1})
			args := f.runnerArgs(tc.spec, 0, "/tmp/runner.sock", "", nil)
			var got []string
			if i := slices.Index(args, "--split-worker"); i >= 0 {
				got = args[i:]
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("split flags (-want +got):\n%s\nwhole command line: %q", d, args)
			}
			if tc.want == nil && slices.Contains(args, "--split-pipeline") {
				t.Errorf("--split-pipeline on a runner that is not a split head: %q", args)
			}
		})
	}
}
