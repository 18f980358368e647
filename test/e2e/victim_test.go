package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// The kill tests' victim: a replica that writes a stream when the kill comes (a
// request before its first event is retried, not continued: a kill then proves
// nothing). Both replicas' runners are stopped (SIGSTOP) while the agents are asked
// which one writes, so that what they answer still holds at the kill however fast the
// machine generates: on an idle machine the tiny model's streams all ended in about
// 4 s, before a poll of the agents saw one writing.

// replicaSide is a replica of a kill test: its agent's address, its key, its runner's
// PID and the agent's count of its streams past their first event before the round
// (streamsPastFirstEvent).
type replicaSide struct {
	r          v1alpha1.ModelReplica
	addr, key  string
	pid, first int
}

// replicaSides reads each replica's agent, runner and count of streams past their
// first event.
func replicaSides(t *testing.T, replicas []v1alpha1.ModelReplica) []replicaSide {
	t.Helper()
	sides := make([]replicaSide, len(replicas))
	for i, r := range replicas {
		sd := replicaSide{r: r, addr: fleet.Agent(r.Spec.NodeName).Addr, key: r.Namespace + "/" + r.Name}
		if sd.pid = int(runnerPIDs(t, sd.addr)[sd.key]); sd.pid == 0 {
			t.Fatalf("no runner for replica %s: %v", sd.key, runnerPIDs(t, sd.addr))
		}
		sd.first = streamsPastFirstEvent(t, sd.addr, sd.key)
		sides[i] = sd
	}
	return sides
}

// killAWriter waits until at least least streams have content (streaming counts
// them); then, each time one more has, it stops every side's runner, asks the agents
// which replica writes a stream, kills that one with kill, and continues the runners.
// It returns the victim's index, or -1 when every stream ended (ended closed) before
// a replica was seen writing.
func killAWriter(ctx context.Context, t *testing.T, sides []replicaSide, streaming *atomic.Int32, least int32,
	ended <-chan struct{}, kill func(t *testing.T, node string, pid int)) int {
	t.Helper()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	seen, asked := "", int32(0)
	for {
		select {
		case <-ended:
			t.Logf("every stream ended before a replica was seen writing one (%s)", seen)
			return -1
		case <-ctx.Done():
			t.Fatalf("no replica was seen writing a stream: %s", seen)
		case <-tick.C:
		}
		s := streaming.Load()
		if s < least || s == asked {
			continue
		}
		asked = s
		signalRunners(t, sides, syscall.SIGSTOP)
		var victim int
		if victim, seen = writingReplica(ctx, t, sides, s); victim < 0 {
			signalRunners(t, sides, syscall.SIGCONT)
			continue
		}
		t.Logf("killing replica %s on %s", sides[victim].key, sides[victim].r.Spec.NodeName)
		kill(t, sides[victim].r.Spec.NodeName, sides[victim].pid)
		signalRunners(t, sides, syscall.SIGCONT) // the victim's too, should it outlive its agent
		return victim
	}
}

// signalRunners sends sig to each side's runner; one that is gone (the victim's,
// killed with its agent) is no error.
func signalRunners(t *testing.T, sides []replicaSide, sig syscall.Signal) {
	t.Helper()
	for _, sd := range sides {
		if err := syscall.Kill(sd.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("%v to runner %d of %s: %v", sig, sd.pid, sd.key, err)
		}
	}
}

// writingReplica is the index of the first side whose agent has a request of its
// replica and a stream of it past its first event (beyond its count before the
// round), or -1 and what each agent answered.
func writingReplica(ctx context.Context, t *testing.T, sides []replicaSide, streaming int32) (int, string) {
	seen := make([]string, 0, len(sides))
	for i, sd := range sides {
		active := activeRequests(ctx, sd.addr, sd.key)
		writing := streamsPastFirstEvent(t, sd.addr, sd.key) - sd.first
		if active >= 1 && writing >= 1 {
			return i, ""
		}
		seen = append(seen, fmt.Sprintf("%s on %s has %d requests, %d past their first event",
			sd.r.Name, sd.r.Spec.NodeName, active, writing))
	}
	return -1, fmt.Sprintf("%d streams have content; %s", streaming, strings.Join(seen, "; "))
}
