package soak

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/localfleet"
)

const (
	namespace = "soak"
	modelFile = "tiny.gguf"
	// storeCapacity is every agent's --store-capacity: a "full disk" is a sparse
	// file this size in the store.
	storeCapacity = 1 << 30
	// convergeTimeout bounds the wait for the invariants, at the start and the end.
	convergeTimeout = 4 * time.Minute
)

// TestSoak runs the chaos soak for SOAK_DURATION (`make soak`; skipped without it),
// with the fault schedule of SOAK_SEED (1 by default). SOAK_REPORT names a file the
// report is written to (markdown).
func TestSoak(t *testing.T) {
	env := os.Getenv("SOAK_DURATION")
	if env == "" {
		t.Skip("SOAK_DURATION is not set: run `make soak`")
	}
	d, err := time.ParseDuration(env)
	if err != nil {
		t.Fatalf("SOAK_DURATION: %v", err)
	}
	seed := uint64(1)
	if s := os.Getenv("SOAK_SEED"); s != "" {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("SOAK_SEED: %v", err)
		}
	}
	fleet := startFleet(t)
	nodes := make([]string, 0, len(localfleet.DefaultNodes))
	for _, n := range localfleet.DefaultNodes {
		nodes = append(nodes, n.Name)
	}
	plan, err := Plan(seed, d, Topology{Nodes: nodes, Gateways: len(fleet.GatewayURLs)})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range plan {
		t.Logf("planned: %s", f)
	}

	ctx := t.Context()
	if err := fleet.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}); err != nil {
		t.Fatal(err)
	}
	deploy := func(name, file string) *v1alpha1.ModelDeployment {
		return &v1alpha1.ModelDeployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
			Spec: v1alpha1.ModelDeploymentSpec{
				Model:     v1alpha1.ModelSource{Source: fleet.ModelsURL + "/" + file},
				Engine:    v1alpha1.EngineSpec{Settings: engine.Settings{ContextLength: 512, Parallel: 2}},
				Replicas:  ptr.To[int32](2),
				Placement: v1alpha1.Placement{Strategy: v1alpha1.Spread},
			},
		}
	}
	cold := deploy("cold", modelFile)
	cold.Spec.Residency = v1alpha1.ResidencyOnDemand
	cold.Spec.IdleTimeout = &metav1.Duration{Duration: 5 * time.Second}
	for _, md := range []*v1alpha1.ModelDeployment{deploy("chat", modelFile), deploy("embed", modelFile), cold} {
		if err := fleet.Client.Create(ctx, md); err != nil {
			t.Fatal(err)
		}
	}
	if v, _ := converge(ctx, fleet); v != nil {
		t.Fatalf("the fleet did not converge before the soak:\n%s", strings.Join(v, "\n"))
	}

	tr := &Traffic{Gateways: fleet.GatewayURLs, ChatModel: "chat", EmbedModel: "embed", ColdModel: "cold",
		Workers: 3, ColdEvery: 8 * time.Second, MaxRequests: 200_000, RequestTimeout: 2 * time.Minute,
		MaxRetries: 6, Seed: seed}
	chaos := &Chaos{Fleet: fleet, Namespace: namespace, StoreCapacity: storeCapacity, Deployment: deploy, Log: t.Logf}
	start := time.Now()
	var wg sync.WaitGroup
	var chaosErr error
	wg.Go(func() { tr.Run(ctx, start.Add(d)) })
	wg.Go(func() { chaosErr = chaos.Run(ctx, start, plan) })
	scales := 0
	wg.Go(func() { scales = scaleChat(ctx, t, fleet, start, d) })
	wg.Wait()
	elapsed := time.Since(start)
	violations, took := converge(ctx, fleet)

	kinds, total := tr.Stats.Kinds()
	report := formatReport(seed, d, elapsed, took, kinds, total, scales, chaos.Applied, violations)
	t.Log("\n" + report)
	if p := os.Getenv("SOAK_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(report), 0o644); err != nil {
			t.Error(err)
		}
	}
	for _, e := range tr.Stats.Errors() {
		t.Log(e)
	}
	if chaosErr != nil {
		t.Errorf("the fault schedule: %v", chaosErr)
	}
	if total.FailedBeforeFirstByte > 0 {
		t.Errorf("%d requests were lost before their first byte", total.FailedBeforeFirstByte)
	}
	for _, k := range []string{ChatStream, Chat, Embeddings, ColdStart} {
		if kinds[k].Succeeded == 0 {
			t.Errorf("no %s request succeeded", k)
		}
	}
	if violations != nil {
		t.Errorf("the fleet did not converge within %s after the soak:\n%s", convergeTimeout, strings.Join(violations, "\n"))
	}
	if t.Failed() {
		localfleet.DumpLogs(os.Stderr, fleet.LogDir(), 40)
	}
}

// startFleet builds macfleet and starts a fleet of two Macs and two gateways.
func startFleet(t *testing.T) *localfleet.Fleet {
	ctrllog.SetLogger(logr.Discard()) // the test's API clients log nothing worth reading
	dir := t.TempDir()
	bin, runner, err := localfleet.Binaries(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	log := &strings.Builder{}
	fleet, err := localfleet.Start(ctx, localfleet.Options{Binary: bin, Runner: runner, Dir: filepath.Join(dir, "fleet"),
		LeaseDuration: 10 * time.Second, NodeLossGrace: 15 * time.Second, Gateways: 2, Log: log,
		AgentArgs: []string{"--store-capacity", strconv.Itoa(storeCapacity)}})
	if err != nil {
		localfleet.DumpLogs(os.Stderr, filepath.Join(dir, "fleet", "logs"), 40)
		t.Fatalf("starting the fleet: %v\n%s", err, log)
	}
	t.Cleanup(fleet.Stop)
	if err := ggufsynth.Write(filepath.Join(fleet.ModelsDir, modelFile), ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	return fleet
}

// scaleChat scales the chat deployment between 2 and 3 replicas every eighth of the
// soak, ending at 2 before the last 15%; it returns how many times it scaled.
func scaleChat(ctx context.Context, t *testing.T, fleet *localfleet.Fleet, start time.Time, d time.Duration) int {
	n := 0
	for i := 1; i < 7; i++ {
		if waitUntil(ctx, start.Add(time.Duration(i)*d/8)) != nil {
			return n
		}
		replicas := int32(2 + i%2)
		if i == 6 {
			replicas = 2
		}
		md := &v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "chat"}}
		patch := client.RawPatch("application/merge-patch+json", fmt.Appendf(nil, `{"spec":{"replicas":%d}}`, replicas))
		if err := fleet.Client.Patch(ctx, md, patch); err != nil {
			t.Errorf("scaling chat to %d: %v", replicas, err)
			return n
		}
		t.Logf("scaled chat to %d replicas", replicas)
		n++
	}
	return n
}

// converge polls the invariants until they hold and returns how long that took, or
// the last violations when they do not hold by convergeTimeout.
func converge(ctx context.Context, fleet *localfleet.Fleet) ([]string, time.Duration) {
	start := time.Now()
	var violations []string
	err := localfleet.Poll(ctx, convergeTimeout, func() (bool, error) {
		s, err := snapshot(ctx, fleet)
		if err != nil {
			violations = []string{err.Error()}
			return false, nil
		}
		violations = Check(s)
		return violations == nil, nil
	}, func() string { return "the invariants" })
	if err != nil {
		return violations, time.Since(start)
	}
	return nil, time.Since(start)
}

func snapshot(ctx context.Context, fleet *localfleet.Fleet) (Snapshot, error) {
	var s Snapshot
	var mds v1alpha1.ModelDeploymentList
	var rs v1alpha1.ModelReplicaList
	var ns v1alpha1.MacNodeList
	for _, l := range []client.ObjectList{&mds, &rs, &ns} {
		if err := fleet.Client.List(ctx, l); err != nil {
			return s, err
		}
	}
	runners, err := fleet.Runners()
	if err != nil {
		return s, err
	}
	s.Deployments, s.Replicas, s.Nodes = mds.Items, rs.Items, ns.Items
	for _, r := range runners {
		s.Runners = append(s.Runners, RunnerProcess{PID: r.PID, Node: r.Node})
	}
	return s, nil
}
