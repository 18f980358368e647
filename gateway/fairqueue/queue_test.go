package fairqueue

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 23, 9, 0, 0, 0, time.UTC)

// op is one step of a scenario: push "I:A1" (class I or B, flow A, label A1), pop
// (expecting the label, "" for none), or remove a label.
type op struct {
	push, pop, remove string
	skip              []string // labels can refuses on this pop
	wantErr           string
}

func push(s string) op   { return op{push: s} }
func pop(want string) op { return op{pop: want} }

func run(t *testing.T, l Limits, ops []op) {
	t.Helper()
	q := New[string](l)
	entries := map[string]*Entry[string]{}
	for i, o := range ops {
		switch {
		case o.push != "":
			cls, label, _ := strings.Cut(o.push, ":")
			p := Interactive
			if cls == "B" {
				p = Batch
			}
			e, err := q.Push(label[:1], p, label, t0.Add(time.Duration(i)*time.Second))
			if o.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), o.wantErr) {
					t.Fatalf("step %d: push %s: error %v, want one containing %q", i, o.push, err, o.wantErr)
				}
				continue
			}
			if err != nil {
				t.Fatalf("step %d: push %s: %v", i, o.push, err)
			}
			entries[label] = e
		case o.remove != "":
			if !q.Remove(entries[o.remove]) {
				t.Fatalf("step %d: remove %s: it was not waiting", i, o.remove)
			}
			if q.Remove(entries[o.remove]) {
				t.Fatalf("step %d: remove %s twice: the second succeeded", i, o.remove)
			}
		default:
			var asked []string
			e, ok := q.Pop(func(v string) bool { asked = append(asked, v); return !slices.Contains(o.skip, v) })
			got := ""
			if ok {
				got = e.Value
				if q.Remove(e) {
					t.Fatalf("step %d: a popped entry could be removed", i)
				}
			}
			if got != o.pop {
				t.Fatalf("step %d: pop = %q (asked %v), want %q", i, got, asked, o.pop)
			}
		}
		n := 0
		for _, p := range Priorities {
			n += q.LenOf(p)
		}
		if n != q.Len() {
			t.Fatalf("step %d: Len %d, classes hold %d", i, q.Len(), n)
		}
	}
}

func TestQueueOrder(t *testing.T) {
	tests := []struct {
		name   string
		limits Limits
		ops    []op
	}{
		{name: "one flow is first in, first out", ops: []op{
			push("I:A1"), push("I:A2"), push("I:A3"), pop("A1"), pop("A2"), pop("A3"), pop("")}},
		{name: "flows take turns", ops: []op{
			push("I:A1"), push("I:A2"), push("I:A3"), push("I:B1"), push("I:C1"),
			pop("A1"), pop("B1"), pop("C1"), pop("A2"), pop("A3"), pop("")}},
		{name: "a flow that arrives waits for one round, not for every request of the others", ops: []op{
			push("I:A1"), push("I:A2"), push("I:A3"), push("I:A4"), pop("A1"),
			push("I:B1"), pop("A2"), pop("B1"), pop("A3"), pop("A4")}},
		{name: "interactive goes first, batch gets one dispatch in five", ops: []op{
			push("B:X1"), push("B:X2"), push("I:A1"), push("I:A2"), push("I:A3"), push("I:A4"), push("I:A5"), push("I:A6"),
			pop("A1"), pop("A2"), pop("A3"), pop("A4"), pop("X1"), pop("A5"), pop("A6"), pop("X2"), pop("")}},
		{name: "batch alone is served at once", ops: []op{push("B:X1"), pop("X1"), push("I:A1"), push("B:X2"), pop("A1"), pop("X2")}},
		{name: "the batch share counts only while batch waits", limits: Limits{BatchShare: 2}, ops: []op{
			push("I:A1"), push("I:A2"), pop("A1"), pop("A2"), push("I:A3"), push("B:X1"), push("I:A4"),
			pop("A3"), pop("X1"), pop("A4")}},
		{name: "a request that cannot be placed is passed over, the next of its flow first", ops: []op{
			push("I:A1"), push("I:A2"), push("I:B1"),
			{pop: "A2", skip: []string{"A1"}}, {pop: "B1", skip: []string{"A1"}}, {pop: "", skip: []string{"A1"}}, pop("A1")}},
		{name: "an interactive request that cannot be placed lets batch go", ops: []op{
			push("I:A1"), push("B:X1"), {pop: "X1", skip: []string{"A1"}}, pop("A1")}},
		{name: "a removed request leaves the others in order", ops: []op{
			push("I:A1"), push("I:B1"), push("I:B2"), push("I:C1"), {remove: "B1"}, pop("A1"), pop("B2"), pop("C1")}},
		{name: "removing the flow whose turn it is passes the turn on", ops: []op{
			push("I:A1"), push("I:A2"), push("I:B1"), push("I:C1"), pop("A1"), {remove: "B1"}, pop("C1"), pop("A2")}},
		{name: "removing an earlier flow keeps the turn", ops: []op{
			push("I:A1"), push("I:A2"), push("I:B1"), push("I:C1"), pop("A1"), {remove: "A2"}, pop("B1"), pop("C1")}},
		{name: "the queue is bounded", limits: Limits{MaxQueued: 3, MaxPerFlow: 3}, ops: []op{
			push("I:A1"), push("I:B1"), push("B:C1"), {push: "I:D1", wantErr: "3 requests are already waiting"},
			pop("A1"), push("I:D1")}},
		{name: "one flow cannot fill the queue", limits: Limits{MaxQueued: 4, MaxPerFlow: 2}, ops: []op{
			push("I:A1"), push("B:A2"), {push: "I:A3", wantErr: "this client already has 2 requests waiting"},
			push("I:B1"), push("I:B2"), pop("A1"), push("I:A3")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { run(t, tt.limits, tt.ops) })
	}
}

func TestFullError(t *testing.T) {
	q := New[int](Limits{MaxQueued: 1})
	if _, err := q.Push("a", Interactive, 1, t0); err != nil {
		t.Fatal(err)
	}
	_, err := q.Push("b", Interactive, 2, t0)
	if fe, ok := errors.AsType[*FullError](err); !ok || fe.PerFlow || fe.Limit != 1 {
		t.Fatalf("err = %#v, want a *FullError of the whole queue with limit 1", err)
	}
	if _, err := q.Push("b", Priority(7), 2, t0); err == nil {
		t.Fatal("an unknown priority was accepted")
	}
}

func TestLimitsDefaults(t *testing.T) {
	for _, tt := range []struct{ in, want Limits }{
		{Limits{}, Limits{MaxQueued: DefaultMaxQueued, MaxPerFlow: DefaultMaxQueued / 4, BatchShare: DefaultBatchShare,
			ReserveSlots: DefaultReserveSlots, ActiveWindow: DefaultActiveWindow}},
		{Limits{MaxQueued: 2, ReserveSlots: 3, ActiveWindow: time.Second}, Limits{MaxQueued: 2, MaxPerFlow: 1,
			BatchShare: DefaultBatchShare, ReserveSlots: 3, ActiveWindow: time.Second}},
		{Limits{MaxQueued: 10, MaxPerFlow: 50, BatchShare: 1, ReserveSlots: -7}, Limits{MaxQueued: 10, MaxPerFlow: 10,
			BatchShare: DefaultBatchShare, ReserveSlots: -1, ActiveWindow: DefaultActiveWindow}},
	} {
		if got := tt.in.WithDefaults(); got != tt.want {
			t.Errorf("%+v.WithDefaults() = %+v, want %+v", tt.in, got, tt.want)
		}
	}
}

func TestParsePriority(t *testing.T) {
	for in, want := range map[string]Priority{"interactive": Interactive, " Batch ": Batch, "BATCH": Batch} {
		if got, err := ParsePriority(in); err != nil || got != want {
			t.Errorf("ParsePriority(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParsePriority("urgent"); err == nil || !strings.Contains(err.Error(), "interactive or batch") {
		t.Errorf("ParsePriority(urgent) error = %v", err)
	}
	if Lower(Interactive, Batch) != Batch || Lower(Batch, Interactive) != Batch || Lower(Interactive, Interactive) != Interactive {
		t.Error("Lower is not the lower priority")
	}
}

// TestQueueRandom drives a queue with random pushes, pops and removals and checks
// what must hold whatever the order: every request leaves exactly once, each flow is
// first in first out, and round robin: between two dispatches of one flow, every
// other flow of its class that waited all along was dispatched.
func TestQueueRandom(t *testing.T) {
	type rec struct {
		flow  string
		class Priority
	}
	flows := []string{"a", "b", "c", "d", "e"} // e is batch
	for seed := range uint64(50) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			q := New[int](Limits{MaxQueued: 40, MaxPerFlow: 15})
			recs := map[int]rec{}
			waiting := map[int]*Entry[int]{}
			count := map[string]int{} // waiting requests per flow
			epoch := map[string]int{} // bumped each time a flow starts waiting anew
			lastID := map[string]int{}
			// At a flow's dispatch: the other flows waiting then, with their epoch,
			// and which of them were dispatched since.
			waitedAt := map[string]map[string]int{}
			servedSince := map[string]map[string]bool{}
			leave := func(id int) {
				f := recs[id].flow
				delete(waiting, id)
				count[f]--
			}
			id := 0
			for step := range 3000 {
				switch r := rng.IntN(10); {
				case r < 5:
					f := flows[rng.IntN(len(flows))]
					p := Interactive
					if f == "e" {
						p = Batch
					}
					id++
					e, err := q.Push(f, p, id, t0)
					if err != nil {
						if count[f] < 15 && len(waiting) < 40 {
							t.Fatalf("step %d: push refused with room: %v", step, err)
						}
						continue
					}
					recs[id] = rec{f, p}
					waiting[id] = e
					if count[f] == 0 {
						epoch[f]++
					}
					count[f]++
				case r < 6 && len(waiting) > 0:
					ids := make([]int, 0, len(waiting))
					for x := range waiting {
						ids = append(ids, x)
					}
					slices.Sort(ids)
					x := ids[rng.IntN(len(ids))]
					if !q.Remove(waiting[x]) {
						t.Fatalf("step %d: removing waiting %d failed", step, x)
					}
					leave(x)
				default:
					e, ok := q.Pop(func(int) bool { return true })
					if ok != (len(waiting) > 0) {
						t.Fatalf("step %d: pop ok=%v with %d waiting", step, ok, len(waiting))
					}
					if !ok {
						continue
					}
					x := e.Value
					if waiting[x] == nil {
						t.Fatalf("step %d: %d popped twice or after its removal", step, x)
					}
					rc := recs[x]
					if x < lastID[rc.flow] {
						t.Fatalf("step %d: flow %s popped %d after %d", step, rc.flow, x, lastID[rc.flow])
					}
					lastID[rc.flow] = x
					leave(x)
					if rc.class != Interactive {
						continue
					}
					for g, ep := range waitedAt[rc.flow] {
						if count[g] > 0 && epoch[g] == ep && !servedSince[rc.flow][g] {
							t.Fatalf("step %d: flow %s served twice while %s waited all along", step, rc.flow, g)
						}
					}
					for f, s := range servedSince {
						if f != rc.flow {
							s[rc.flow] = true
						}
					}
					servedSince[rc.flow] = map[string]bool{}
					waitedAt[rc.flow] = map[string]int{}
					for _, g := range flows[:4] {
						if g != rc.flow && count[g] > 0 {
							waitedAt[rc.flow][g] = epoch[g]
						}
					}
				}
				if q.Len() != len(waiting) {
					t.Fatalf("step %d: Len %d, %d waiting", step, q.Len(), len(waiting))
				}
			}
		})
	}
}
