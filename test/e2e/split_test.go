package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testassets"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// A replica split across Macs (issue 27), end to end: placed as a gang on simulated
// Macs that are each too small for the model, served through the gateway, compared
// token for token with the same model in one process, and replaced whole when a
// worker shard is killed.

// splitModelFile is a model whose layers dominate its memory, as a model larger than
// any Mac's does: Llama31Spec's real Llama 3 vocabulary and Llama 3.1 chat template
// (tools included) on four layers, served with a long context, so that each layer's
// share of the KV cache (splitContext × 2 sequences × 512 bytes a token: 112 MiB) is
// larger than what the agent of a simulated Mac needs for itself (splitAgentAllowance).
// The runner's head otherwise dwarfs the layers: its compute buffer holds a batch's
// logits over the 128,256-token vocabulary, its output buffer and vocabulary tables
// another ~100 MiB (internal/estimate). The KV cache costs no disk and no compute until
// it fills.
const (
	splitModelFile = "split.gguf"
	splitContext   = 114688
)

var splitModel = sync.OnceValue(func() error {
	spec, err := splitSpec()
	if err != nil {
		return err
	}
	return ggufsynth.Write(filepath.Join(fleet.ModelsDir, splitModelFile), spec)
})

// splitSpec is splitModelFile's model.
func splitSpec() (ggufsynth.Spec, error) {
	spec, err := testassets.Llama31Spec()
	spec.Name, spec.Layers, spec.Embd, spec.Heads, spec.KVHeads, spec.Ctx = "macfleet-split", 4, 128, 2, 2, 131072
	return spec, err
}

// splitPoolLabel puts a MacNode in a pool of simulated Macs sized for one test's gang;
// the split deployment selects its pool, so no other Mac holds its shards.
const splitPoolLabel = "e2e.macfleet.dev/split-pool"

// splitDeployment serves splitModelFile; maxMacs above 1 lets a replica span that many
// Macs of pool (a nodeSelector), 1 (and no pool) serves it in one process on the
// fleet's largest Mac (mac-studio-1: the smaller one would hold the replica's
// reservation with too little room left for its agent's own footprint).
func splitDeployment(ns, name string, maxMacs int32, pool string) *v1alpha1.ModelDeployment {
	return deployment(ns, name, 1, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model.Source = fleet.ModelsURL + "/" + splitModelFile
		md.Spec.Engine.ContextLength = splitContext
		md.Spec.Placement.MaxMacsPerReplica = maxMacs
		md.Spec.Placement.NodeSelector = map[string]string{v1alpha1.LabelMemoryGiB: "64"}
		if pool != "" {
			md.Spec.Placement.NodeSelector = map[string]string{splitPoolLabel: pool}
		}
	})
}

// layerMemoryOf waits until the deployment's (pending) replica carries its
// layerMemory, the division of its reservation the scheduler places a gang by.
func layerMemoryOf(t *testing.T, ns, name string) v1alpha1.LayerMemory {
	t.Helper()
	var lm v1alpha1.LayerMemory
	testenv.Eventually(t, time.Minute, 200*time.Millisecond, func() (bool, string) {
		rs := replicasOf(t, ns, name)
		if len(rs) != 1 || rs[0].Spec.LayerMemory == nil {
			return false, fmt.Sprintf("want one replica with a layerMemory: %s", describeReplicas(rs))
		}
		lm = *rs[0].Spec.LayerMemory
		return true, ""
	})
	return lm
}

// replicasOf lists a deployment's replicas.
func replicasOf(t testing.TB, ns, name string) []v1alpha1.ModelReplica {
	t.Helper()
	var list v1alpha1.ModelReplicaList
	if err := fleet.Client.List(t.Context(), &list, client.InNamespace(ns),
		client.MatchingLabels{v1alpha1.LabelDeployment: name}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// addSplitPool adds one simulated Mac per memory ceiling (bytes) to the fleet, in
// pool, and removes them when the test ends (after its deployments, which are
// registered later and so cleaned up first). It returns their names in order.
func addSplitPool(t *testing.T, pool string, ceilings ...int64) []string {
	t.Helper()
	return addSplitPoolWith(t, pool, nil, ceilings...)
}

// addSplitPoolWith is addSplitPool with each agent restarted with the arguments
// restart gives (none when nil), before its Mac is labelled into the pool.
func addSplitPoolWith(t *testing.T, pool string, restart func() []string, ceilings ...int64) []string {
	t.Helper()
	var names []string
	for i, c := range ceilings {
		name := fmt.Sprintf("split-%s-%d", pool, i)
		names = append(names, name)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := fleet.RemoveAgent(ctx, name); err != nil {
				t.Errorf("removing Mac %s: %v", name, err)
			}
		})
		n := localfleet.Node{Name: name, MemoryCeiling: strconv.FormatInt(c, 10),
			Chip: "Apple M4 (simulated)", UnifiedMemory: "16Gi"}
		if err := fleet.AddAgent(t.Context(), n); err != nil {
			t.Fatal(err)
		}
		if restart != nil {
			restartAgentWith(t, name, restart())
		}
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:%q}}}`, splitPoolLabel, pool)
		mn := &v1alpha1.MacNode{}
		mn.Name = name
		if err := fleet.Client.Patch(t.Context(), mn, client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Fatal(err)
		}
	}
	return names
}

// splitAgentAllowance is the memory each simulated Mac has beyond its shard: the
// agent's engine pool counts its own footprint (about 55 MiB) as in use when it admits
// a load, and the scheduler leaves that footprint free on each Mac (MacNode
// status.memory.agent), so a Mac without the allowance would hold no shard at all.
const splitAgentAllowance = 96 << 20

// checkAgentsFit fails unless each named Mac's agent reports its own memory
// (status.memory.agent, which the scheduler leaves free) within splitAgentAllowance:
// the allowance is what let the gang's Macs hold their shards.
func checkAgentsFit(t *testing.T, names []string) {
	t.Helper()
	for _, name := range names {
		mn := &v1alpha1.MacNode{}
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Name: name}, mn); err != nil {
			t.Fatal(err)
		}
		a := mn.Status.Memory.Agent
		if a == nil || a.Sign() <= 0 || a.Value() > splitAgentAllowance {
			t.Errorf("MacNode %s: status.memory.agent %v, want above 0 and at most %d", name, a, splitAgentAllowance)
			continue
		}
		t.Logf("MacNode %s: its agent uses %s itself", name, a)
	}
}

// poolCeilings sizes a pool for a gang of len(layers) shards of a replica with lm:
// the head's Mac holds the head and layers[0] layers, each other Mac a worker and its
// layers, each with splitAgentAllowance to spare, less than a layer: the scheduler
// finds room on each Mac for exactly its layers, so the whole replica fits none of
// them and the gang needs every one.
func poolCeilings(t *testing.T, lm v1alpha1.LayerMemory, layers ...int64) []int64 {
	t.Helper()
	per := lm.PerLayer.Value()
	if per <= splitAgentAllowance {
		t.Fatalf("a layer reserves %d bytes, not more than the agent's allowance %d: the pool cannot be sized", per, splitAgentAllowance)
	}
	out := make([]int64, len(layers))
	for i, n := range layers {
		base := lm.Worker.Value()
		if i == 0 {
			base = lm.Head.Value()
		}
		out[i] = base + n*per + splitAgentAllowance
	}
	return out
}

// checkGang checks that the deployment's one Ready replica is a gang on the Macs of
// macs (the head first), every shard Ready in status.shards, and returns it.
func checkGang(t *testing.T, ns, name string, macs []string) v1alpha1.ModelReplica {
	t.Helper()
	rs := waitReady(t, ns, name, 1, 3*time.Minute)
	r := rs[0]
	if r.Spec.Split == nil || len(r.Spec.Split.Shards) != len(macs) || r.Spec.NodeName != macs[0] {
		t.Fatalf("replica %s: node %q, split %+v; want a gang on %v, head first", r.Name, r.Spec.NodeName, r.Spec.Split, macs)
	}
	var nodes []string
	for _, s := range r.Spec.Split.Shards {
		nodes = append(nodes, s.Node)
	}
	slices.Sort(nodes)
	if want := slices.Sorted(slices.Values(macs)); !slices.Equal(nodes, want) {
		t.Fatalf("the gang's shards are on %v, want %v", nodes, want)
	}
	if !gangShardsReady(&r) {
		t.Fatalf("replica %s is Ready with status.shards %+v", r.Name, r.Status.Shards)
	}
	t.Logf("gang %s: %s layers %s; reserving %s, the head measured %v peak", r.Name, r.Spec.Split.Macs, r.Spec.Split.Layers,
		&r.Spec.MemoryReservation, r.Status.Memory.Peak)
	return r
}

// gangShardsReady reports whether every shard of a split replica reports Ready.
func gangShardsReady(r *v1alpha1.ModelReplica) bool {
	if r.Spec.Split == nil {
		return false
	}
	for _, s := range r.Spec.Split.Shards {
		i := slices.IndexFunc(r.Status.Shards, func(st v1alpha1.ShardStatus) bool { return st.Node == s.Node })
		if i < 0 || r.Status.Shards[i].Phase != v1alpha1.ReplicaReady {
			return false
		}
	}
	return true
}

// splitPrompts are the greedy chats compared between a split and a whole replica.
var splitPrompts = []string{"Hello", "Tell me about the sea.", "What is two plus two?", "Write a haiku about Macs."}

// greedy sends one greedy chat completion (streamed or not) and returns its text.
func greedy(t *testing.T, c openai.Client, model, prompt string, stream bool) string {
	t.Helper()
	p := params(t, fmt.Sprintf(`{"model":%q,"max_tokens":24,"temperature":0,"seed":1,
		"messages":[{"role":"user","content":%q}]}`, model, prompt))
	if !stream {
		r, err := c.Chat.Completions.New(t.Context(), p)
		if err != nil {
			t.Fatalf("%s: %v", model, err)
		}
		return r.Choices[0].Message.Content
	}
	s := c.Chat.Completions.NewStreaming(t.Context(), p)
	var b strings.Builder
	for s.Next() {
		if ch := s.Current(); len(ch.Choices) > 0 {
			b.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatalf("%s streamed: %v", model, err)
	}
	return b.String()
}

// greedyTokens sends one greedy chat completion with logprobs and returns the tokens
// it generated, as the server names them (text and bytes).
func greedyTokens(t *testing.T, c openai.Client, model, prompt string) []string {
	t.Helper()
	r, err := c.Chat.Completions.New(t.Context(), params(t, fmt.Sprintf(`{"model":%q,"max_tokens":24,"temperature":0,"seed":1,
		"logprobs":true,"messages":[{"role":"user","content":%q}]}`, model, prompt)))
	if err != nil {
		t.Fatalf("%s: %v", model, err)
	}
	var tokens []string
	for _, lp := range r.Choices[0].Logprobs.Content {
		tokens = append(tokens, fmt.Sprintf("%q%v", lp.Token, lp.Bytes))
	}
	return tokens
}

// forcedToolCall asks for a forced get_weather call and returns its arguments.
func forcedToolCall(t *testing.T, c openai.Client, model string) string {
	t.Helper()
	r, err := c.Chat.Completions.New(t.Context(), params(t, fmt.Sprintf(`{"model":%q,"max_tokens":64,"temperature":0,"seed":1,
		"tool_choice":"required","parallel_tool_calls":false,"tools":[%s],
		"messages":[{"role":"user","content":"Weather in Paris?"}]}`, model, e2eWeatherTool)))
	if err != nil {
		t.Fatalf("%s: %v", model, err)
	}
	msg := r.Choices[0].Message
	if r.Choices[0].FinishReason != "tool_calls" || len(msg.ToolCalls) != 1 || msg.ToolCalls[0].Function.Name != "get_weather" {
		t.Fatalf("%s: finish %q, message %+v: want one get_weather call", model, r.Choices[0].FinishReason, msg)
	}
	return msg.ToolCalls[0].Function.Arguments
}

// twoTurns has a conversation of two turns, the second extending the first, and
// returns both answers and the second turn's cached prompt tokens.
func twoTurns(t *testing.T, c openai.Client, model string) (first, second string, cached int64) {
	t.Helper()
	turn := func(messages string) *openai.ChatCompletion {
		r, err := c.Chat.Completions.New(t.Context(), params(t, fmt.Sprintf(`{"model":%q,"max_tokens":16,"temperature":0,"seed":1,
			"messages":[%s]}`, model, messages)))
		if err != nil {
			t.Fatalf("%s: %v", model, err)
		}
		return r
	}
	msgs := `{"role":"system","content":"You are a terse assistant who answers every question about the sea in one line."},
		{"role":"user","content":"Why is the sea salty?"}`
	r1 := turn(msgs)
	first = r1.Choices[0].Message.Content
	r2 := turn(fmt.Sprintf(`%s,{"role":"assistant","content":%q},{"role":"user","content":"And why is it blue?"}`, msgs, first))
	return first, r2.Choices[0].Message.Content, r2.Usage.PromptTokensDetails.CachedTokens
}

// compareWithWhole checks that the split model answers token for token as whole does
// (greedy text, streamed and not, a forced tool call and a two-turn conversation) and
// that its second turn restores the first's prompt from the cache.
func compareWithWhole(t *testing.T, split, whole string) {
	t.Helper()
	c := gatewayClient()
	for _, p := range splitPrompts {
		want := greedy(t, c, whole, p, false)
		if got := greedy(t, c, split, p, false); got != want {
			t.Errorf("prompt %q: split answered %q, one process %q", p, got, want)
		}
		if got := greedy(t, c, split, p, true); got != want {
			t.Errorf("prompt %q streamed: split answered %q, one process %q", p, got, want)
		}
		if want == "" {
			t.Errorf("prompt %q: an empty answer compares nothing", p)
		}
		wantTokens, gotTokens := greedyTokens(t, c, whole, p), greedyTokens(t, c, split, p)
		if !slices.Equal(gotTokens, wantTokens) || len(wantTokens) == 0 {
			t.Errorf("prompt %q: split generated the tokens %v, one process %v", p, gotTokens, wantTokens)
		}
	}
	if got, want := forcedToolCall(t, c, split), forcedToolCall(t, c, whole); got != want {
		t.Errorf("tool call arguments: split %q, one process %q", got, want)
	}
	f1, s1, cached := twoTurns(t, c, split)
	f2, s2, _ := twoTurns(t, c, whole)
	if f1 != f2 || s1 != s2 {
		t.Errorf("two turns: split %q then %q, one process %q then %q", f1, s1, f2, s2)
	}
	if cached <= 0 {
		t.Errorf("the split replica's second turn had %d cached prompt tokens, want the first turn's prompt restored", cached)
	}
}

// gangLayers divides layers over n shards for a pool: an even share each, the rest
// on the head.
func gangLayers(layers int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = layers / int64(n)
	}
	out[0] += layers % int64(n)
	return out
}

// splitServing deploys splitModelFile twice: "whole" in one process, and "split" with
// maxMacsPerReplica macs on a pool of that many new simulated Macs each too small for
// it, each in a namespace of its own (a replica's measured footprint sizes the later
// replicas of its namespace: the whole one's would let a replacement of the split one
// be placed whole). It waits until both are Ready, checks that "split" is a gang over
// the whole pool, and returns both model names, the pool's Macs (the head's first) and
// the gang. With pipeline above 1 both have that many slots and the split head decodes
// them in that many llama contexts (engine.splitPipeline).
func splitServing(t *testing.T, pool string, macs int, pipeline int32) (split, whole string, names []string, gang v1alpha1.ModelReplica) {
	t.Helper()
	if err := splitModel(); err != nil {
		t.Fatal(err)
	}
	nsWhole, ns := testenv.NewNamespace(t, fleet.Client), testenv.NewNamespace(t, fleet.Client)
	mdWhole, mdSplit := splitDeployment(nsWhole, "whole", 1, ""), splitDeployment(ns, "split", int32(macs), pool)
	if pipeline > 1 {
		mdWhole.Spec.Engine.Parallel, mdSplit.Spec.Engine.Parallel = pipeline, pipeline
		mdSplit.Spec.Engine.SplitPipeline = pipeline
		// The head's and the worker's extra compute buffers are not scaled with the
		// reservation: on this small model they outweigh two layers, so a pool sized
		// for the pipelined gang would hold the whole replica (one context) on its
		// head's Mac. A reservation of about 6x the estimate (1.5 GB) makes the layers
		// outweigh them, so the gang needs both Macs.
		q := resource.MustParse("8Gi")
		mdSplit.Spec.Resources = &v1alpha1.ModelResources{Memory: &q}
	}
	create(t, mdWhole)
	// With its memory set, the split deployment still gets its replica only once the
	// controller has read the header (layerMemory comes with it).
	create(t, mdSplit)
	// The pool's Macs are sized from the replica's layerMemory: until they are added,
	// the replica is pending (no Mac matches its nodeSelector).
	lm := layerMemoryOf(t, ns, "split")
	t.Logf("layerMemory: %d layers of %s, head %s, worker %s", lm.Layers, &lm.PerLayer, &lm.Head, &lm.Worker)
	names = addSplitPool(t, pool, poolCeilings(t, lm, gangLayers(int64(lm.Layers), macs)...)...)
	// The split deployment goes before the pool's Macs (cleanups run last in, first
	// out), so that their agents stop no shard of a live gang.
	t.Cleanup(func() { removeDeployment(t, ns, "split") })
	gang = checkGang(t, ns, "split", names)
	checkAgentsFit(t, names)
	waitReady(t, nsWhole, "whole", 1, 3*time.Minute)
	return ns + "/split", nsWhole + "/whole", names, gang
}

// TestSplitReplicaServes: a deployment with maxMacsPerReplica 2 whose replica fits none
// of its pool's Macs is placed across two of them and serves through the gateway token
// for token as the same model in one process; then a worker shard's process killed with
// SIGKILL mid-stream ends that stream (continued or with the error) in bounded time, the gang is replaced
// whole (no replica is Ready with a shard that is not), and the deployment serves again.
func TestSplitReplicaServes(t *testing.T) {
	split, whole, macs, gang := splitServing(t, "two", 2, 1)
	compareWithWhole(t, split, whole)
	if t.Failed() {
		return
	}

	t.Run("worker killed", func(t *testing.T) { killWorkerMidStream(t, gang, macs) })
	if want, got := greedy(t, gatewayClient(), whole, splitPrompts[1], false),
		greedy(t, gatewayClient(), split, splitPrompts[1], false); got != want {
		t.Errorf("after the gang was replaced: split answered %q, one process %q", got, want)
	}
}

// TestSplitReplicaAcrossThreeMacs: the same on three Macs (the head and two workers,
// whose hidden states pass through the head): no two of the pool's Macs can hold the
// replica, so the gang takes all three and answers as one process does.
func TestSplitReplicaAcrossThreeMacs(t *testing.T) {
	split, whole, _, gang := splitServing(t, "three", 3, 1)
	compareWithWhole(t, split, whole)

	// The first worker's Mac carries its output to the second's over their peer link
	// (--next): the head's runner reports that worker's pushes, and none of the last.
	key := gang.Namespace + "/" + gang.Name
	testenv.Eventually(t, 30*time.Second, 200*time.Millisecond, func() (bool, string) {
		var st struct {
			Models []enginepool.ModelSnapshot `json:"models"`
		}
		if err := agentGet(t.Context(), fleet.Agent(gang.Spec.NodeName).Addr, "/api/status", &st); err != nil {
			return false, err.Error()
		}
		for _, m := range st.Models {
			if m.Name != key || m.Split == nil || len(m.Split.Workers) != 2 {
				continue
			}
			w := m.Split.Workers
			ok := w[0].PeerLink && w[0].PeerBytesSent > 0 && !w[1].PeerLink && w[1].PeerBytesSent == 0
			return ok, fmt.Sprintf("workers' peer links: %v (%d bytes pushed), %v (%d bytes pushed); want the first pushing to the second",
				w[0].PeerLink, w[0].PeerBytesSent, w[1].PeerLink, w[1].PeerBytesSent)
		}
		return false, "the head's agent reports no split of " + key
	})
}

// killWorkerMidStream kills the worker shard of gang with SIGKILL while a streamed
// request is generating, and checks that the stream ends (continued, or with the error)
// within the gateway's continue timeout, the gang is replaced whole on macs and the new
// one is Ready.
func killWorkerMidStream(t *testing.T, gang v1alpha1.ModelReplica, macs []string) {
	ns, name := gang.Namespace, gang.Labels[v1alpha1.LabelDeployment]
	worker := workerShardPID(t, gang.Spec.Split.Shards[1].Node)
	c := gatewayClient()
	s := c.Chat.Completions.NewStreaming(t.Context(), params(t, fmt.Sprintf(`{"model":%q,"max_tokens":1500,"temperature":0,
		"messages":[{"role":"user","content":"Tell me a very long story about the sea."}]}`, ns+"/"+name)))
	var killed time.Time
	chunks := 0
	for s.Next() {
		chunks++
		if ch := s.Current(); killed.IsZero() && len(ch.Choices) > 0 && ch.Choices[0].Delta.Content != "" {
			if err := syscall.Kill(worker, syscall.SIGKILL); err != nil {
				t.Fatalf("killing the worker %d: %v", worker, err)
			}
			killed = time.Now()
		}
	}
	took := time.Since(killed)
	if killed.IsZero() {
		t.Fatalf("the stream ended (%d chunks, %v) before any content to kill the worker at", chunks, s.Err())
	}
	// The gateway continues the broken stream on a replica that takes it within its
	// continue timeout (the new gang, once Ready: seen here); else the stream ends with
	// the lost worker's error after that timeout.
	if err := s.Err(); err != nil {
		if bound := gateway.DefaultContinueTimeout + 5*time.Second; took > bound {
			t.Errorf("the stream ended %v after the kill, want within %v", took, bound)
		}
		if !strings.Contains(err.Error(), runnerapi.CodeSplitWorkerLost) {
			t.Errorf("the stream ended with %v, want %s", err, runnerapi.CodeSplitWorkerLost)
		}
	}
	t.Logf("the stream ended %v after the kill (%d chunks): %v", took.Round(time.Millisecond), chunks, s.Err())

	// The gang is replaced whole: the killed one never serves again, and no replica is
	// Ready while one of its shards is not.
	testenv.Eventually(t, 3*time.Minute, 200*time.Millisecond, func() (bool, string) {
		rs := replicasOf(t, ns, name)
		for i := range rs {
			r := &rs[i]
			ready := conditionTrue(r.Status.Conditions, v1alpha1.ReplicaReady)
			if r.UID == gang.UID && ready {
				return false, "the killed gang " + r.Name + " is still Ready"
			}
			if ready && !gangShardsReady(r) {
				t.Fatalf("replica %s is Ready with status.shards %+v: a partial gang serves", r.Name, r.Status.Shards)
			}
		}
		ok := len(rs) == 1 && rs[0].UID != gang.UID && conditionTrue(rs[0].Status.Conditions, v1alpha1.ReplicaReady)
		return ok, "a new gang to be Ready:" + describeReplicas(rs)
	})
	next := checkGang(t, ns, name, macs)
	if pid := workerShardPID(t, next.Spec.Split.Shards[1].Node); pid == worker {
		t.Errorf("the new gang's worker has the killed worker's pid %d", pid)
	}
}

// workerShardPID is the pid of the one worker shard process the agent of node runs.
func workerShardPID(t *testing.T, node string) int {
	t.Helper()
	var pid int
	testenv.Eventually(t, 30*time.Second, 100*time.Millisecond, func() (bool, string) {
		runners, err := fleet.Runners()
		if err != nil {
			t.Fatal(err)
		}
		var found []int
		for _, r := range runners {
			if r.Node == node && r.Worker && processAlive(r.PID) {
				found = append(found, r.PID)
			}
		}
		if len(found) != 1 {
			return false, fmt.Sprintf("worker processes on %s: %v (of %+v), want one", node, found, runners)
		}
		pid = found[0]
		return true, ""
	})
	return pid
}

// processAlive reports whether pid is a process that has not exited: neither gone
// nor a zombie its parent has not reaped yet (Linux: /proc/<pid>/stat).
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	return ok && !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}
