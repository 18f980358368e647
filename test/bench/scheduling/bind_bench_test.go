package scheduling

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/scheduler"
	"github.com/macfleet/macfleet/test/support/testenv"
)

const (
	fleetNodes       = 100
	fleetDeployments = 100
	perDeployment    = 10
	// creators is how many goroutines create objects, in both phases.
	creators = 16
	gi       = int64(1) << 30
	// runLabel marks one phase's MacNodes; that phase's scheduler caches only them.
	runLabel = "bench.macfleet.dev/run"
	chipM2   = "Apple-M2-Ultra"
	chipM4   = "Apple-M4-Max"
)

// BenchmarkBind creates 100 MacNodes (with their agents' status), 100 ModelDeployments
// and 1,000 ModelReplicas as fast as 16 goroutines can, with a scheduler running, and
// measures until the scheduler has written every binding (then a List from the API
// server verifies that every replica is bound). Before that, in the same process
// and against the same API server, it creates the same objects with no scheduler
// running: the baseline. Metrics:
//
//	bind-s       creation start → every replica bound, with the scheduler
//	create-s     creation alone, with the scheduler running
//	baseline-s   creation alone, no scheduler
//	x-baseline   bind-s / baseline-s: what scheduling adds
//	solves       solves the scheduler ran (a burst coalesces)
//	solving-s    time spent in those solves
//	latency-ms   mean scheduling latency (replica seen → bound)
//
// The fleet: Macs with 64, 128 or 192 GiB ceilings, half of them labelled with one
// chip; replicas of 2–8 GiB, one per Mac per deployment; a fifth of the deployments
// Spread, a fifth OnDemand, a tenth selecting the labelled chip, the rest BinPack.
// At the end the benchmark checks that no Mac is over-committed, no deployment has
// two replicas on one Mac and every selector is honoured.
//
// Sub-benchmarks vary the scheduler's write parallelism (Reconciler.Workers).
//
//	go test -run '^$' -bench BenchmarkBind -benchtime 1x ./test/bench/scheduling/
func BenchmarkBind(b *testing.B) {
	e := testenv.Start(b, testenv.WithScheme(v1alpha1.AddToScheme))
	for _, workers := range []int{1, 8, 16} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			for b.Loop() {
				baseline := createFleet(b, e.Client, newPhase(b, e.Client))

				p := newPhase(b, e.Client)
				startScheduler(b, e, p, workers)
				solves0, solveSum0 := histogram(b, scheduler.MetricSolveDuration)
				latN0, latSum0 := histogram(b, scheduler.MetricSchedulingLatency)
				bindings0 := counter(b, scheduler.MetricBindingsTotal)

				start := time.Now()
				created := createFleet(b, e.Client, p)
				waitAllBound(b, e.Client, p, bindings0)
				bound := time.Since(start)

				solves, solveSum := histogram(b, scheduler.MetricSolveDuration)
				latN, latSum := histogram(b, scheduler.MetricSchedulingLatency)
				bindings := counter(b, scheduler.MetricBindingsTotal) - bindings0
				if want := float64(fleetDeployments * perDeployment); bindings != want {
					b.Errorf("%v bindings written, want %v", bindings, want)
				}
				checkFleet(b, e.Client, p)

				b.ReportMetric(bound.Seconds(), "bind-s")
				b.ReportMetric(created.Seconds(), "create-s")
				b.ReportMetric(baseline.Seconds(), "baseline-s")
				b.ReportMetric(bound.Seconds()/baseline.Seconds(), "x-baseline")
				b.ReportMetric(float64(solves-solves0), "solves")
				b.ReportMetric(solveSum-solveSum0, "solving-s")
				b.ReportMetric((latSum-latSum0)/float64(latN-latN0)*1000, "latency-ms")
				b.Logf("workers=%d: %d replicas on %d Macs bound in %v (objects created in %v); baseline (no scheduler) %v; ratio %.2f; %d solves; mean latency %.0fms",
					workers, fleetDeployments*perDeployment, fleetNodes, bound.Round(time.Millisecond), created.Round(time.Millisecond),
					baseline.Round(time.Millisecond), bound.Seconds()/baseline.Seconds(), solves-solves0, (latSum-latSum0)/float64(latN-latN0)*1000)
			}
		})
	}
}

// phase is one run's namespace and node label; nodes are named <ns>-mac-NNN.
type phase struct{ ns string }

func newPhase(b *testing.B, c client.Client) phase {
	return phase{ns: testenv.NewNamespace(b, c)}
}

func (p phase) node(i int) string { return fmt.Sprintf("%s-mac-%03d", p.ns, i) }

// createFleet creates the nodes (then their status), the deployments and the
// replicas, each stage on creators goroutines, and returns how long it took.
func createFleet(b *testing.B, c client.Client, p phase) time.Duration {
	b.Helper()
	ctx := b.Context()
	start := time.Now()

	nodes := make([]*v1alpha1.MacNode, fleetNodes)
	parallel(b, fleetNodes, func(i int) error {
		n := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{
			Name:   p.node(i),
			Labels: map[string]string{runLabel: p.ns, v1alpha1.LabelChip: chipM4},
		}}
		ceiling := int64(64+64*(i%3)) * gi // 64, 128, 192 GiB
		if i%2 == 0 {
			n.Labels[v1alpha1.LabelChip] = chipM2
		}
		if err := c.Create(ctx, n); err != nil {
			return err
		}
		n.Status.Memory.Ceiling = resource.NewQuantity(ceiling, resource.BinarySI)
		n.Status.Conditions = []metav1.Condition{{
			Type: v1alpha1.MacNodeReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonAgentReady, LastTransitionTime: metav1.Now(),
		}}
		nodes[i] = n
		return c.Status().Update(ctx, n)
	})
	b.Cleanup(func() {
		for _, n := range nodes {
			if n != nil {
				_ = c.Delete(context.Background(), n)
			}
		}
	})

	deps := make([]*v1alpha1.ModelDeployment, fleetDeployments)
	parallel(b, fleetDeployments, func(d int) error {
		md := &v1alpha1.ModelDeployment{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("model-%03d", d), Namespace: p.ns},
			Spec: v1alpha1.ModelDeploymentSpec{
				Model:    v1alpha1.ModelSource{Source: fmt.Sprintf("hf://org/model-%03d/model.gguf", d)},
				Replicas: ptr.To[int32](perDeployment),
			},
		}
		switch d % 10 {
		case 0, 5:
			md.Spec.Placement.Strategy = v1alpha1.Spread
		case 1, 6:
			md.Spec.Residency = v1alpha1.ResidencyOnDemand
		case 2:
			// Half the Macs carry this chip.
			md.Spec.Placement.NodeSelector = map[string]string{v1alpha1.LabelChip: chipM2}
		}
		deps[d] = md
		return c.Create(ctx, md)
	})

	parallel(b, fleetDeployments*perDeployment, func(i int) error {
		md := deps[i/perDeployment]
		res := md.Spec.Residency
		if res == "" {
			res = v1alpha1.ResidencyResident
		}
		mem := int64(2+(i/perDeployment)%7) * gi // 2 … 8 GiB per replica
		r := &v1alpha1.ModelReplica{
			ObjectMeta: metav1.ObjectMeta{
				Name:            fmt.Sprintf("%s-%d", md.Name, i%perDeployment),
				Namespace:       p.ns,
				Labels:          map[string]string{v1alpha1.LabelDeployment: md.Name, v1alpha1.LabelTemplateHash: "h1"},
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(md, v1alpha1.GroupVersion.WithKind("ModelDeployment"))},
			},
			Spec: v1alpha1.ModelReplicaSpec{
				Template:          v1alpha1.ModelReplicaTemplate{Model: md.Spec.Model, Residency: res},
				TemplateHash:      "h1",
				MemoryReservation: *resource.NewQuantity(mem, resource.BinarySI),
			},
		}
		return c.Create(ctx, r)
	})
	return time.Since(start)
}

// parallel runs fn(0..n-1) on creators goroutines and fails b on the first error.
func parallel(b *testing.B, n int, fn func(int) error) {
	b.Helper()
	work := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range creators {
		wg.Go(func() {
			for i := range work {
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if first != nil {
		b.Fatal(first)
	}
}

// startScheduler runs a manager whose cache holds only p's namespace and nodes, with
// a scheduler Reconciler, and waits for its caches to sync.
func startScheduler(b *testing.B, e *testenv.Env, p phase, workers int) {
	b.Helper()
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{
		Scheme:                 e.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{p.ns: {}},
			ByObject: map[client.Object]cache.ByObject{
				&v1alpha1.MacNode{}: {Label: labels.SelectorFromSet(labels.Set{runLabel: p.ns})},
			},
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := (&scheduler.Reconciler{Workers: workers}).SetupWithManager(mgr); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	})
	for _, obj := range []client.Object{&v1alpha1.MacNode{}, &v1alpha1.ModelReplica{}, &v1alpha1.ModelDeployment{}} {
		if _, err := mgr.GetCache().GetInformer(b.Context(), obj, cache.BlockUntilSynced(true)); err != nil {
			b.Fatal(err)
		}
	}
}

// waitAllBound waits until the scheduler has written a binding for every replica of
// the phase — its bindings counter, read in-process every few milliseconds, so that
// waiting costs the API server nothing — then lists the replicas from the API server
// to verify that every one is bound.
func waitAllBound(b *testing.B, c client.Client, p phase, bindings0 float64) {
	b.Helper()
	want := fleetDeployments * perDeployment
	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for counter(b, scheduler.MetricBindingsTotal)-bindings0 < float64(want) && time.Now().Before(deadline) {
		<-tick.C
	}
	var list v1alpha1.ModelReplicaList
	if err := c.List(b.Context(), &list, client.InNamespace(p.ns)); err != nil {
		b.Fatal(err)
	}
	bound := 0
	var why []string
	for _, r := range list.Items {
		if r.Spec.NodeName != "" {
			bound++
		} else if c := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ReplicaScheduled); c != nil && len(why) < 5 {
			why = append(why, r.Name+": "+c.Message)
		}
	}
	if len(list.Items) != want || bound != want {
		b.Fatalf("%d of %d replicas (want %d) bound; unbound: %q", bound, len(list.Items), want, why)
	}
}

// checkFleet verifies the outcome: no Mac over-committed, no two replicas of a
// deployment on one Mac, node selectors honoured.
func checkFleet(b *testing.B, c client.Client, p phase) {
	b.Helper()
	var nodes v1alpha1.MacNodeList
	var replicas v1alpha1.ModelReplicaList
	if err := c.List(b.Context(), &nodes, client.MatchingLabels{runLabel: p.ns}); err != nil {
		b.Fatal(err)
	}
	if err := c.List(b.Context(), &replicas, client.InNamespace(p.ns)); err != nil {
		b.Fatal(err)
	}
	byName := map[string]*v1alpha1.MacNode{}
	for i := range nodes.Items {
		byName[nodes.Items[i].Name] = &nodes.Items[i]
	}
	committed := map[string]int64{}
	seen := map[string]bool{}
	for _, r := range replicas.Items {
		n := byName[r.Spec.NodeName]
		if n == nil {
			b.Errorf("%s bound to unknown node %q", r.Name, r.Spec.NodeName)
			continue
		}
		if r.Spec.Template.Residency != v1alpha1.ResidencyOnDemand {
			committed[n.Name] += r.Spec.MemoryReservation.Value()
		} else if r.Spec.MemoryReservation.Cmp(*n.Status.Memory.Ceiling) > 0 {
			b.Errorf("OnDemand %s does not fit %s alone", r.Name, n.Name)
		}
		key := r.Labels[v1alpha1.LabelDeployment] + "@" + n.Name
		if seen[key] {
			b.Errorf("two replicas of %s on %s", r.Labels[v1alpha1.LabelDeployment], n.Name)
		}
		seen[key] = true
		if dep := r.Labels[v1alpha1.LabelDeployment]; depIndex(dep)%10 == 2 && n.Labels[v1alpha1.LabelChip] != chipM2 {
			b.Errorf("%s needs chip %s, bound to %s (%s)", r.Name, chipM2, n.Name, n.Labels[v1alpha1.LabelChip])
		}
	}
	for name, used := range committed {
		if ceiling := byName[name].Status.Memory.Ceiling.Value(); used > ceiling {
			b.Errorf("%s over-committed: %d GiB reserved, ceiling %d GiB", name, used/gi, ceiling/gi)
		}
	}
}

func depIndex(name string) int {
	var d int
	fmt.Sscanf(strings.TrimPrefix(name, "model-"), "%d", &d)
	return d
}

// histogram returns the sample count and sum of a histogram in the manager's registry.
func histogram(b *testing.B, name string) (uint64, float64) {
	h := gather(b, name).GetHistogram()
	return h.GetSampleCount(), h.GetSampleSum()
}

func counter(b *testing.B, name string) float64 {
	return gather(b, name).GetCounter().GetValue()
}

// gather returns the only series of the unlabelled metric name.
func gather(b *testing.B, name string) *dto.Metric {
	b.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0]
		}
	}
	b.Fatalf("metric %s is not registered (or not a single series)", name)
	return nil
}
