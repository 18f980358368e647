package e2e

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"testing"
)

// TestPipelinedSplitReplicaServes: a deployment with maxMacsPerReplica 2 and
// engine.splitPipeline 2 (two slots) is placed across two Macs; its head's runner is
// started with --split-pipeline 2, its worker's without, and it serves through the
// gateway token for token as the same model in one process with two slots.
func TestPipelinedSplitReplicaServes(t *testing.T) {
	split, whole, macs, gang := splitServing(t, "piped", 2, 2)
	if got := gang.Spec.Template.Engine.SplitPipeline; got != 2 {
		t.Errorf("the gang's template has splitPipeline %d, want 2", got)
	}
	runners, err := fleet.Runners()
	if err != nil {
		t.Fatal(err)
	}
	heads := 0
	for _, r := range runners {
		if !slices.Contains(macs, r.Node) {
			continue
		}
		args := cmdline(t, r.PID)
		i := slices.Index(args, "--split-pipeline")
		switch {
		case r.Worker && i >= 0:
			t.Errorf("the worker on %s was started with --split-pipeline: %q", r.Node, args)
		case !r.Worker:
			heads++
			if i < 0 || i+1 >= len(args) || args[i+1] != "2" {
				t.Errorf("the head on %s was started without --split-pipeline 2: %q", r.Node, args)
			}
		}
	}
	if heads != 1 {
		t.Errorf("%d head runners on the gang's Macs %v, want 1", heads, macs)
	}
	compareWithWhole(t, split, whole)
}

// cmdline is the command line of process pid, from /proc (Linux only, as the fleet's
// Runners).
func cmdline(t *testing.T, pid int) []string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatalf("reading the command line of runner %d: %v", pid, err)
	}
	var args []string
	for _, a := range bytes.Split(bytes.TrimSuffix(b, []byte{0}), []byte{0}) {
		args = append(args, string(a))
	}
	return args
}
