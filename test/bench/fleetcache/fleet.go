package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testassets"
)

// The fleet under test: 4 simulated Macs, one deployment with a replica on each, and
// one in-process gateway per routing mode in front of it.

const (
	namespace  = "bench"
	deployName = "tenants"
	modelFile  = "llama31-vocab.gguf"
)

// macs are the simulated Macs: alike, so that only the routing tells them apart.
func macs(n int) []localfleet.Node {
	nodes := make([]localfleet.Node, n)
	for i := range nodes {
		nodes[i] = localfleet.Node{Name: fmt.Sprintf("mac-%d", i+1), MemoryCeiling: "2Gi",
			Chip: "Apple M2 Pro (simulated)", UnifiedMemory: "32Gi"}
	}
	return nodes
}

// writeModel synthesizes the model with the real Llama 3 vocabulary and Llama 3.1
// chat template (testassets.Llama31Spec) into the fleet's model directory.
func writeModel(f *localfleet.Fleet) (ggufsynth.Spec, error) {
	spec, err := testassets.Llama31Spec()
	if err != nil {
		return spec, err
	}
	return spec, ggufsynth.Write(filepath.Join(f.ModelsDir, modelFile), spec)
}

// deploy creates the namespace and the deployment: one replica per Mac, two slots of
// ctxPerSlot tokens each, the prompt cache at the agents' budgets.
func deploy(ctx context.Context, f *localfleet.Fleet, replicas int32, ctxPerSlot int) error {
	if err := f.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		return err
	}
	md := &v1alpha1.ModelDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: deployName},
		Spec: v1alpha1.ModelDeploymentSpec{
			Model:    v1alpha1.ModelSource{Source: f.ModelsURL + "/" + modelFile},
			Engine:   v1alpha1.EngineSpec{Settings: engine.Settings{ContextLength: int32(2 * ctxPerSlot), Parallel: 2}},
			Replicas: ptr.To(replicas),
		},
	}
	return f.Client.Create(ctx, md)
}

// waitReplicas waits until want replicas of the deployment are Ready, on distinct Macs.
func waitReplicas(ctx context.Context, f *localfleet.Fleet, want int) error {
	var last string
	return localfleet.Poll(ctx, 5*time.Minute, func() (bool, error) {
		var list v1alpha1.ModelReplicaList
		if err := f.Client.List(ctx, &list, client.InNamespace(namespace),
			client.MatchingLabels{v1alpha1.LabelDeployment: deployName}); err != nil {
			return false, nil
		}
		ready, nodes := 0, map[string]bool{}
		for _, r := range list.Items {
			for _, c := range r.Status.Conditions {
				if c.Type == v1alpha1.ReplicaReady && c.Status == metav1.ConditionTrue {
					ready++
					nodes[r.Spec.NodeName] = true
				}
			}
		}
		last = fmt.Sprintf("%d of %d replicas Ready on %d Macs", ready, want, len(nodes))
		return ready >= want, nil
	}, func() string { return last })
}

// gatewayProc is one in-process gateway of a routing mode.
type gatewayProc struct {
	url  string
	reg  *prometheus.Registry
	done chan error
}

var ctrlLogOnce sync.Once

// Benchmark modes beyond the gateway's routings: prefix-cache routing without the
// record of the prefixes being prefilled (gateway.Config.NoInFlightPrefixes), as
// before it; and prefix-cache routing with peer fetch (a replica that misses a prefix
// another Mac's replica holds fetches its state when that is estimated faster than
// prefilling). The plain prefix-cache mode runs without peer fetch, so that the four
// of least-load, prefix-affinity, prefix-cache and prefix-cache-peer-fetch compare
// routing alone and routing with peer fetch in one run.
const (
	modeNoInFlight = "prefix-cache-no-inflight"
	modePeerFetch  = "prefix-cache-peer-fetch"
)

// gatewayModeConfig is what a benchmark mode sets in the gateway's configuration.
type gatewayModeConfig struct {
	Routing            gateway.Routing
	NoInFlightPrefixes bool
	DisablePeerFetch   bool
}

// gatewayMode is the routing, the in-flight switch and the peer-fetch switch of a
// benchmark mode.
func gatewayMode(mode string) gatewayModeConfig {
	switch mode {
	case modeNoInFlight:
		return gatewayModeConfig{Routing: gateway.RoutingPrefixCache, NoInFlightPrefixes: true, DisablePeerFetch: true}
	case modePeerFetch:
		return gatewayModeConfig{Routing: gateway.RoutingPrefixCache}
	}
	return gatewayModeConfig{Routing: gateway.Routing(mode), DisablePeerFetch: true}
}

// startGateway runs a gateway of the given mode in this process until ctx ends,
// as the fleet's gateway identity (its agent certificate from the fleet's Secret).
func startGateway(ctx context.Context, f *localfleet.Fleet, mode string) (*gatewayProc, error) {
	m := gatewayMode(mode)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &gatewayProc{url: "http://" + ln.Addr().String(), reg: prometheus.NewRegistry(), done: make(chan error, 1)}
	cfg := gateway.Config{RestConfig: f.Env.Config, Listener: ln, MetricsAddr: "0", ProbeAddr: "0",
		AgentCertSecret: v1alpha1.SystemNamespace + "/" + v1alpha1.GatewayTLSSecret, Registerer: g.reg,
		DisableConsole: true, Routing: m.Routing, NoInFlightPrefixes: m.NoInFlightPrefixes, DisablePeerFetch: m.DisablePeerFetch,
		GatewayID: "bench-" + mode}
	ctrlLogOnce.Do(func() { ctrl.SetLogger(logr.Discard()) })
	go func() { g.done <- gateway.Run(ctrl.LoggerInto(ctx, logr.Discard()), cfg) }()
	return g, nil
}

// routed sums the gateway's routing decisions by kind.
func (g *gatewayProc) routed() (map[string]float64, error) {
	mfs, err := g.reg.Gather()
	if err != nil {
		return nil, err
	}
	// The routing decisions by kind; peer fetches by result ("peer fetch: imported",
	// "peer fetch: not_found", ...) and the bytes they moved ("peer fetch bytes").
	labels := map[string]struct{ label, prefix string }{
		"macfleet_gateway_routing_decisions_total": {"routing", ""},
		"macfleet_gateway_peer_fetches_total":      {"result", "peer fetch: "},
		"macfleet_gateway_peer_fetch_bytes_total":  {"", "peer fetch bytes"},
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		want, ok := labels[mf.GetName()]
		if !ok {
			continue
		}
		for _, m := range mf.GetMetric() {
			if want.label == "" {
				out[want.prefix] += m.GetCounter().GetValue()
				continue
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == want.label {
					out[want.prefix+l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out, nil
}

// agentStatus is what the benchmark reads of an agent's GET /api/status.
type agentStatus struct {
	Models []struct {
		Name        string `json:"name"`
		PromptCache *struct {
			HotHits        int64 `json:"hotHits"`
			HotMisses      int64 `json:"hotMisses"`
			Hits           int64 `json:"hits"`
			Misses         int64 `json:"misses"`
			Restores       int64 `json:"restores"`
			RestoredTokens int64 `json:"restoredTokens"`
			// InflightShares, InflightSharedTokens: restores from a slot prefilling
			// the prefix (issue 26), counted in Restores too.
			InflightShares       int64 `json:"inflightShares"`
			InflightSharedTokens int64 `json:"inflightSharedTokens"`
			HotBytes             int64 `json:"hotBytes"`
			HotEntries           int   `json:"hotEntries"`
			HotBudgetBytes       int64 `json:"hotBudgetBytes"`
			SSDBytes             int64 `json:"ssdBytes"`
			SSDEntries           int   `json:"ssdEntries"`
			SSDQuotaBytes        int64 `json:"ssdQuotaBytes"`
		} `json:"promptCache"`
	} `json:"models"`
}

// counters sums the prompt cache counters of every runner of every agent; with
// contents, it also prints what each runner's tiers hold against their budgets.
func counters(ctx context.Context, f *localfleet.Fleet, contents bool) (tierCounters, error) {
	var sum tierCounters
	agents := f.Agents()
	names := slices.Sorted(maps.Keys(agents))
	for _, name := range names {
		a := agents[name]
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+a.Addr+"/api/status", nil)
		if err != nil {
			return sum, err
		}
		resp, err := f.AgentHTTP.Do(req)
		if err != nil {
			return sum, fmt.Errorf("the status of %s: %w", name, err)
		}
		var st agentStatus
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			return sum, fmt.Errorf("the status of %s: %w", name, err)
		}
		for _, m := range st.Models {
			if pc := m.PromptCache; pc != nil {
				sum = sum.add(tierCounters{pc.HotHits, pc.HotMisses, pc.Hits, pc.Misses, pc.Restores, pc.RestoredTokens,
					pc.InflightShares, pc.InflightSharedTokens})
				if contents {
					fmt.Printf("  %s: hot %d entries, %.1f of %.1f MiB; SSD %d entries, %.1f of %.1f MiB\n", name, pc.HotEntries,
						mib(pc.HotBytes), mib(pc.HotBudgetBytes), pc.SSDEntries, mib(pc.SSDBytes), mib(pc.SSDQuotaBytes))
				}
			}
		}
	}
	return sum, nil
}

// clearHot empties every agent's hot tiers (POST /api/cache/clear), so that each mode
// starts from the same memory state; the SSD tiers stay (the modes' prefixes differ).
func clearHot(ctx context.Context, f *localfleet.Fleet) error {
	for name, a := range f.Agents() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+a.Addr+"/api/cache/clear", nil)
		if err != nil {
			return err
		}
		resp, err := f.AgentHTTP.Do(req)
		if err != nil {
			return fmt.Errorf("clearing %s: %w", name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("clearing %s: %s", name, resp.Status)
		}
	}
	return nil
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// fleetDir is a fresh directory for the fleet, removed by the caller.
func fleetDir() (string, error) { return os.MkdirTemp("", "macfleet-bench-fleetcache-") }
