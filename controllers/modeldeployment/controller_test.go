package modeldeployment

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/test/support/testenv"
)

func newDeployment(name, src string, replicas int32, memory string) *v1alpha1.ModelDeployment {
	md := &v1alpha1.ModelDeployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.ModelDeploymentSpec{
			Model:    v1alpha1.ModelSource{Source: src},
			Replicas: ptr.To(replicas),
		},
	}
	if memory != "" {
		q := resource.MustParse(memory)
		md.Spec.Resources = &v1alpha1.ModelResources{Memory: &q}
	}
	return md
}

// noEstimate fails the test if the controller estimates.
func noEstimate(t *testing.T) func(context.Context, estimate.Params) (estimate.Result, error) {
	return func(_ context.Context, p estimate.Params) (estimate.Result, error) {
		t.Errorf("unexpected estimate of %s", p.URL)
		return estimate.Result{}, fmt.Errorf("no estimates in this test")
	}
}

func TestCreateReplicas(t *testing.T) {
	f := newFixture(t)
	f.start(&Reconciler{Estimate: noEstimate(t)})
	md := f.create(newDeployment("qwen", "https://models.example/qwen.gguf", 3, "6Gi"))

	reps := f.waitReplicas(3)
	hash := templateHash(replicaTemplate(f.deployment("qwen")))
	wantTemplate := v1alpha1.ModelReplicaTemplate{
		Model:     v1alpha1.ModelSource{Source: "https://models.example/qwen.gguf", ServedName: "qwen"},
		Engine:    v1alpha1.EngineSpec{Settings: engine.Settings{ContextLength: 4096, Parallel: 1, KVCacheType: v1alpha1.KVCacheF16}},
		Residency: v1alpha1.ResidencyResident,
	}
	for _, mr := range reps {
		if !strings.HasPrefix(mr.Name, "qwen-"+hash+"-") || len(mr.Name) != len("qwen-"+hash+"-")+5 {
			t.Errorf("replica name %q, want qwen-%s-<5 random>", mr.Name, hash)
		}
		if diff := cmp.Diff(map[string]string{v1alpha1.LabelDeployment: "qwen", v1alpha1.LabelTemplateHash: hash}, mr.Labels); diff != "" {
			t.Errorf("%s labels (-want +got):\n%s", mr.Name, diff)
		}
		owner := metav1.GetControllerOf(&mr)
		if owner == nil || owner.UID != md.UID || owner.Kind != "ModelDeployment" || !ptr.Deref(owner.BlockOwnerDeletion, false) {
			t.Errorf("%s controller owner %+v, want ModelDeployment %s", mr.Name, owner, md.UID)
		}
		if mr.Spec.TemplateHash != hash || mr.Spec.MemoryReservation.String() != "6Gi" || mr.Spec.NodeName != "" {
			t.Errorf("%s spec: hash %s, reservation %s, node %q", mr.Name, mr.Spec.TemplateHash, mr.Spec.MemoryReservation.String(), mr.Spec.NodeName)
		}
		if diff := cmp.Diff(wantTemplate, mr.Spec.Template); diff != "" {
			t.Errorf("%s template (-want +got):\n%s", mr.Name, diff)
		}
	}
	got := f.waitStatus("qwen", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.Replicas == 3 && md.Status.ObservedGeneration == md.Generation,
			fmt.Sprintf("status %+v", md.Status)
	})
	if got.Status.Selector != "macfleet.dev/deployment=qwen" || got.Status.Endpoint != "http://qwen."+f.ns+".svc:8080" ||
		got.Status.Ready != "0/3" || got.Status.EstimatedMemory.String() != "6Gi" ||
		got.Status.Display == nil || got.Status.Display.Estimated != "6.0 GiB" {
		t.Errorf("status %+v", got.Status)
	}
	if c := condition(got, v1alpha1.DeploymentAvailable); !strings.HasPrefix(c, "False/MinimumReplicasUnavailable") {
		t.Errorf("Available %s", c)
	}

	// The scheduler cannot place one; the others are placed and become ready.
	f.setUnschedulable(&reps[0], "0/3 Macs fit: 3 insufficient memory (need 6.0GiB, largest free 4.0GiB)")
	f.waitStatus("qwen", func(md *v1alpha1.ModelDeployment) (bool, string) {
		c := condition(md, v1alpha1.DeploymentScheduled)
		return c == "False/Unschedulable: 1 of 3 replicas unschedulable: 0/3 Macs fit: 3 insufficient memory (need 6.0GiB, largest free 4.0GiB)", c
	})
	f.bind(&reps[1], "mac-b")
	f.bind(&reps[2], "mac-a")
	f.markReady(&reps[1])
	f.markReady(&reps[2])
	before := reps[2].DeepCopy()
	peak := resource.MustParse("5Gi")
	reps[2].Status.Memory.Peak = &peak
	if err := f.c.Status().Patch(t.Context(), &reps[2], client.MergeFrom(before)); err != nil {
		t.Fatal(err)
	}
	f.waitStatus("qwen", func(md *v1alpha1.ModelDeployment) (bool, string) {
		ok := md.Status.ReadyReplicas == 2 && md.Status.MeasuredMemory != nil && md.Status.MeasuredMemory.String() == "5Gi" &&
			md.Status.Display != nil && md.Status.Display.Measured == "5.0 GiB" &&
			cmp.Equal(md.Status.Nodes, []string{"mac-a", "mac-b"}) && md.Status.Ready == "2/3"
		return ok, fmt.Sprintf("status %+v", md.Status)
	})

	// Bound and ready: available, scheduled, done.
	f.bind(&reps[0], "mac-c")
	f.markReady(&reps[0])
	got = f.waitStatus("qwen", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.ReadyReplicas == 3 && strings.HasPrefix(condition(md, v1alpha1.DeploymentProgressing), "True/NewReplicasAvailable"),
			fmt.Sprintf("status %+v", md.Status)
	})
	for typ, want := range map[string]string{
		v1alpha1.DeploymentAvailable: "True/MinimumReplicasAvailable",
		v1alpha1.DeploymentScheduled: "True/AllReplicasScheduled",
	} {
		if c := condition(got, typ); !strings.HasPrefix(c, want) {
			t.Errorf("%s = %s, want %s", typ, c, want)
		}
	}
	if got.Status.Ready != "3/3" || !cmp.Equal(got.Status.Nodes, []string{"mac-a", "mac-b", "mac-c"}) {
		t.Errorf("status %+v", got.Status)
	}
}

// TestScaleDownOrder: unbound replicas go first, then not-ready ones, then the newest.
func TestScaleDownOrder(t *testing.T) {
	f := newFixture(t)
	f.start(&Reconciler{Estimate: noEstimate(t)})
	f.create(newDeployment("m", "http://models.example/m.gguf", 1, "1Gi"))
	oldest := f.waitReplicas(1)[0]
	f.bind(&oldest, "mac-1")
	f.markReady(&oldest)

	// Creation timestamps have one-second resolution: wait for the next second so
	// that "newest" is decided by time, not by name.
	testenv.Eventually(t, 3*time.Second, poll, func() (bool, string) {
		return time.Now().Truncate(time.Second).After(oldest.CreationTimestamp.Time), "same second"
	})
	f.update("m", func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To[int32](4) })
	reps := f.waitReplicas(4)
	var newer []v1alpha1.ModelReplica
	for _, r := range reps {
		if r.Name != oldest.Name {
			newer = append(newer, r)
		}
	}
	// newer[0]: bound and ready; newer[1]: bound, loading; newer[2]: unbound.
	readyNew, loading, unbound := newer[0], newer[1], newer[2]
	f.bind(&readyNew, "mac-2")
	f.markReady(&readyNew)
	f.bind(&loading, "mac-3")
	f.waitStatus("m", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.ReadyReplicas == 2 && len(md.Status.Nodes) == 3, fmt.Sprintf("%+v", md.Status)
	})

	for _, step := range []struct {
		replicas int32
		gone     string
	}{{3, unbound.Name}, {2, loading.Name}, {1, readyNew.Name}} {
		f.update("m", func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To(step.replicas) })
		reps := f.waitReplicas(int(step.replicas))
		for _, r := range reps {
			if r.Name == step.gone {
				t.Fatalf("scale to %d kept %s, want it deleted; left %v", step.replicas, step.gone, names(reps))
			}
		}
	}
	if reps := f.replicas(); reps[0].Name != oldest.Name {
		t.Errorf("left %s, want the oldest %s", reps[0].Name, oldest.Name)
	}
	f.update("m", func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To[int32](0) })
	f.waitReplicas(0)
	md := f.waitStatus("m", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.Replicas == 0 && md.Status.Ready == "0/0", fmt.Sprintf("%+v", md.Status)
	})
	if c := condition(md, v1alpha1.DeploymentScheduled); !strings.HasPrefix(c, "True/NoReplicasRequested") {
		t.Errorf("Scheduled %s", c)
	}
}

// readyWatch follows the namespace's replicas through a watch and records, after every
// event, how many replicas exist and how many of them are Ready.
type readyWatch struct {
	mu               sync.Mutex
	ready            map[string]bool
	minReady, maxAll int
	events           int
}

func (f *fixture) watchReplicas(ctx context.Context) (*readyWatch, func()) {
	f.t.Helper()
	wc, err := client.NewWithWatch(apiServer(f.t).Config, client.Options{Scheme: apiServer(f.t).Scheme})
	if err != nil {
		f.t.Fatal(err)
	}
	var list v1alpha1.ModelReplicaList
	if err := wc.List(ctx, &list, client.InNamespace(f.ns)); err != nil {
		f.t.Fatal(err)
	}
	rw := &readyWatch{ready: map[string]bool{}, minReady: 1 << 30}
	for i := range list.Items {
		rw.ready[list.Items[i].Name] = isReady(&list.Items[i])
	}
	w, err := wc.Watch(ctx, &v1alpha1.ModelReplicaList{}, client.InNamespace(f.ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
	if err != nil {
		f.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			mr, ok := ev.Object.(*v1alpha1.ModelReplica)
			if !ok {
				continue
			}
			rw.mu.Lock()
			switch ev.Type {
			case watch.Added, watch.Modified:
				rw.ready[mr.Name] = isReady(mr) && mr.DeletionTimestamp == nil
			case watch.Deleted:
				delete(rw.ready, mr.Name)
			}
			n := 0
			for _, r := range rw.ready {
				if r {
					n++
				}
			}
			rw.minReady = min(rw.minReady, n)
			rw.maxAll = max(rw.maxAll, len(rw.ready))
			rw.events++
			rw.mu.Unlock()
		}
	}()
	return rw, func() { w.Stop(); <-done }
}

// TestRollingUpdateZeroReadyGap changes the template of a deployment whose replicas
// all serve and checks, at every replica event and every deployment status the API
// server recorded, that the ready replicas never drop below desired, and that the
// rollout surges by one replica at most.
func TestRollingUpdateZeroReadyGap(t *testing.T) {
	const desired = 3
	f := newFixture(t)
	f.start(&Reconciler{Estimate: noEstimate(t)})
	f.runAgents()
	f.create(newDeployment("roll", "http://models.example/a.gguf", desired, "2Gi"))
	f.waitStatus("roll", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.ReadyReplicas == desired && md.Status.Replicas == desired, fmt.Sprintf("%+v", md.Status)
	})
	oldHash := f.replicas()[0].Spec.TemplateHash

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rw, stopReplicas := f.watchReplicas(ctx)
	var mdMinReady atomic.Int32
	mdMinReady.Store(1 << 30)
	stopDeployments := f.watchDeployment(ctx, "roll", func(md *v1alpha1.ModelDeployment) {
		if md.Status.ReadyReplicas < mdMinReady.Load() {
			mdMinReady.Store(md.Status.ReadyReplicas)
		}
	})

	f.update("roll", func(md *v1alpha1.ModelDeployment) { md.Spec.Engine.ContextLength = 8192 })
	md := f.waitStatus("roll", func(md *v1alpha1.ModelDeployment) (bool, string) {
		done := md.Status.ObservedGeneration == md.Generation &&
			md.Status.UpdatedReplicas == desired && md.Status.Replicas == desired && md.Status.ReadyReplicas == desired &&
			strings.HasPrefix(condition(md, v1alpha1.DeploymentProgressing), "True/NewReplicasAvailable")
		return done, fmt.Sprintf("%+v", md.Status)
	})
	newHash := templateHash(replicaTemplate(md))
	reps := f.replicas()
	for _, r := range reps {
		if r.Spec.TemplateHash != newHash || r.Spec.Template.Engine.ContextLength != 8192 {
			t.Errorf("replica %s has hash %s (old %s, new %s)", r.Name, r.Spec.TemplateHash, oldHash, newHash)
		}
	}
	// Let the watches see the last events: the replica watch has seen them once the
	// deployment status (written after them) says so, but poll to be sure.
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		rw.mu.Lock()
		defer rw.mu.Unlock()
		return len(rw.ready) == desired, fmt.Sprintf("watch sees %d replicas", len(rw.ready))
	})
	stopReplicas()
	stopDeployments()

	rw.mu.Lock()
	defer rw.mu.Unlock()
	t.Logf("replica events %d: min ready %d, max replicas %d; deployment min readyReplicas %d", rw.events, rw.minReady, rw.maxAll, mdMinReady.Load())
	if rw.minReady < desired {
		t.Errorf("ready replicas dropped to %d during the rollout, want at least %d", rw.minReady, desired)
	}
	if rw.maxAll > desired+maxSurge || rw.maxAll < desired+1 {
		t.Errorf("at most %d replicas existed at once, want %d (surge of one)", rw.maxAll, desired+maxSurge)
	}
	if rw.events < 4*desired {
		t.Errorf("only %d replica events: the watch missed the rollout", rw.events)
	}
	if got := mdMinReady.Load(); got < desired {
		t.Errorf("deployment status readyReplicas dropped to %d, want at least %d", got, desired)
	}
	if c := condition(md, v1alpha1.DeploymentAvailable); !strings.HasPrefix(c, "True/") {
		t.Errorf("Available %s", c)
	}
}

// watchDeployment calls fn with every version of the deployment the API server records.
func (f *fixture) watchDeployment(ctx context.Context, name string, fn func(*v1alpha1.ModelDeployment)) func() {
	f.t.Helper()
	wc, err := client.NewWithWatch(apiServer(f.t).Config, client.Options{Scheme: apiServer(f.t).Scheme})
	if err != nil {
		f.t.Fatal(err)
	}
	md := f.deployment(name)
	fn(md)
	w, err := wc.Watch(ctx, &v1alpha1.ModelDeploymentList{}, client.InNamespace(f.ns),
		client.MatchingFields{"metadata.name": name}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: md.ResourceVersion}})
	if err != nil {
		f.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if md, ok := ev.Object.(*v1alpha1.ModelDeployment); ok {
				fn(md)
			}
		}
	}()
	return func() { w.Stop(); <-done }
}

// A rollout whose new replica cannot be placed leaves the old replicas serving.
func TestStuckRolloutKeepsOldReplicas(t *testing.T) {
	f := newFixture(t)
	f.start(&Reconciler{Estimate: noEstimate(t)})
	f.create(newDeployment("stuck", "http://models.example/a.gguf", 2, "2Gi"))
	for i, r := range f.waitReplicas(2) {
		f.bind(&r, fmt.Sprintf("mac-%d", i))
		f.markReady(&r)
	}
	f.waitStatus("stuck", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.ReadyReplicas == 2, fmt.Sprintf("%+v", md.Status)
	})
	// A bigger reservation rolls the replicas too.
	f.update("stuck", func(md *v1alpha1.ModelDeployment) { md.Spec.Resources.Memory = ptr.To(resource.MustParse("64Gi")) })
	var surge *v1alpha1.ModelReplica
	for _, r := range f.waitReplicas(3) {
		if r.Spec.MemoryReservation.String() == "64Gi" {
			surge = &r
		}
	}
	if surge == nil {
		t.Fatalf("no replica reserves 64Gi: %v", names(f.replicas()))
	}
	f.setUnschedulable(surge, "0/2 Macs fit: 2 insufficient memory (need 64.0GiB, largest free 30.0GiB)")
	md := f.waitStatus("stuck", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return strings.HasPrefix(condition(md, v1alpha1.DeploymentScheduled), "False/Unschedulable: 1 of 3 replicas unschedulable"),
			condition(md, v1alpha1.DeploymentScheduled)
	})
	if c := condition(md, v1alpha1.DeploymentAvailable); !strings.HasPrefix(c, "True/") {
		t.Errorf("Available %s, want True: the old replicas serve", c)
	}
	if c := condition(md, v1alpha1.DeploymentProgressing); !strings.HasPrefix(c, "True/ReplicasUpdating") {
		t.Errorf("Progressing %s", c)
	}
	if md.Status.UpdatedReplicas != 1 || md.Status.ReadyReplicas != 2 {
		t.Errorf("status %+v", md.Status)
	}
	// Nothing else happens: the controller leaves the old replicas alone. (The status
	// above was written after the controller's last pass on these replicas.)
	if reps := f.replicas(); len(reps) != 3 {
		t.Errorf("%d replicas, want 3: %v", len(reps), names(reps))
	}
}

// ggufServer serves a synthesized tiny GGUF at /model.gguf and at the hub path of
// hf://macfleet/tiny/model.gguf; it answers 404 until serving is set.
type ggufServer struct {
	*httptest.Server
	path     string
	serving  atomic.Bool
	requests atomic.Int64
}

func newGGUFServer(t *testing.T, serving bool) *ggufServer {
	t.Helper()
	s := &ggufServer{path: filepath.Join(t.TempDir(), "tiny.gguf")}
	if err := ggufsynth.Write(s.path, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	s.serving.Store(serving)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.requests.Add(1)
		if !s.serving.Load() || (r.URL.Path != "/model.gguf" && r.URL.Path != "/hub/macfleet/tiny/resolve/main/model.gguf") {
			http.NotFound(w, r)
			return
		}
		f, err := os.Open(s.path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer f.Close()
		fi, _ := f.Stat()
		http.ServeContent(w, r, "model.gguf", fi.ModTime(), f)
	}))
	t.Cleanup(s.Close)
	return s
}

// wantReservation is what the controller should reserve for the tiny model.
func (s *ggufServer) wantReservation(t *testing.T, ctx int32) string {
	t.Helper()
	res, err := estimate.Estimate(t.Context(), estimate.Params{Path: s.path, ContextLength: ctx, Parallel: 1})
	if err != nil {
		t.Fatal(err)
	}
	return roundUpMiB(res.Total).String()
}

func TestEstimateFromGGUFHeader(t *testing.T) {
	srv := newGGUFServer(t, true)
	f := newFixture(t)
	f.start(&Reconciler{Resolver: &modelsource.Resolver{HFEndpoint: srv.URL + "/hub"}})

	for _, tc := range []struct{ name, src string }{
		{"http", srv.URL + "/model.gguf"},
		{"hf", "hf://macfleet/tiny/model.gguf"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			md := newDeployment("est-"+tc.name, tc.src, 2, "")
			md.Spec.Engine.ContextLength = 2048
			f.create(md)
			want := srv.wantReservation(t, 2048)
			got := f.waitStatus(md.Name, func(md *v1alpha1.ModelDeployment) (bool, string) {
				return md.Status.EstimatedMemory != nil && md.Status.Replicas == 2, fmt.Sprintf("%+v", md.Status)
			})
			if got.Status.EstimatedMemory.String() != want {
				t.Errorf("estimatedMemory %s, want %s", got.Status.EstimatedMemory.String(), want)
			}
			for _, r := range f.replicas() {
				if r.Labels[v1alpha1.LabelDeployment] == md.Name && r.Spec.MemoryReservation.String() != want {
					t.Errorf("%s reserves %s, want %s", r.Name, r.Spec.MemoryReservation.String(), want)
				}
			}
		})
	}

	// Scaling, and reconciles caused by replica changes, reuse the cached estimate.
	n := srv.requests.Load()
	f.update("est-http", func(md *v1alpha1.ModelDeployment) { md.Spec.Replicas = ptr.To[int32](4) })
	f.waitStatus("est-http", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.Replicas == 4, fmt.Sprintf("%+v", md.Status)
	})
	if got := srv.requests.Load(); got != n {
		t.Errorf("the server saw %d more requests after the estimate was cached", got-n)
	}
}

func TestEstimateFailureRetries(t *testing.T) {
	srv := newGGUFServer(t, false)
	f := newFixture(t)
	f.start(&Reconciler{
		Resolver:             &modelsource.Resolver{HFEndpoint: srv.URL + "/hub"},
		EstimateRetryInitial: 100 * time.Millisecond,
		EstimateRetryMax:     400 * time.Millisecond,
	})
	f.create(newDeployment("late", "hf://macfleet/tiny/model.gguf", 2, ""))
	md := f.waitStatus("late", func(md *v1alpha1.ModelDeployment) (bool, string) {
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentScheduled)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonEstimateFailed, condition(md, v1alpha1.DeploymentScheduled)
	})
	wantMsg := "estimating the memory of hf://macfleet/tiny/model.gguf: GET " + srv.URL + "/hub/macfleet/tiny/resolve/main/model.gguf: 404 Not Found"
	if c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentScheduled); c.Message != wantMsg {
		t.Errorf("Scheduled message %q, want %q", c.Message, wantMsg)
	}
	if c := condition(md, v1alpha1.DeploymentProgressing); !strings.HasPrefix(c, "False/MemoryEstimateFailed") {
		t.Errorf("Progressing %s", c)
	}
	if md.Status.EstimatedMemory != nil || md.Status.ObservedGeneration == md.Generation {
		t.Errorf("status %+v: no estimate and an unsuccessful pass", md.Status)
	}
	// It retries, with backoff, and creates no replica without a reservation.
	testenv.Eventually(t, wait, poll, func() (bool, string) {
		return srv.requests.Load() >= 3, fmt.Sprintf("%d requests", srv.requests.Load())
	})
	if reps := f.replicas(); len(reps) != 0 {
		t.Fatalf("replicas %v created without a reservation", names(reps))
	}

	srv.serving.Store(true)
	want := srv.wantReservation(t, 4096)
	md = f.waitStatus("late", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.Replicas == 2 && md.Status.EstimatedMemory != nil && md.Status.ObservedGeneration == md.Generation,
			fmt.Sprintf("%+v", md.Status)
	})
	if md.Status.EstimatedMemory.String() != want {
		t.Errorf("estimatedMemory %s, want %s", md.Status.EstimatedMemory.String(), want)
	}
	if c := condition(md, v1alpha1.DeploymentScheduled); !strings.HasPrefix(c, "Unknown/SchedulingPending") {
		t.Errorf("Scheduled %s after the estimate succeeded", c)
	}
}

func TestFileSourceUsesResourcesMemory(t *testing.T) {
	f := newFixture(t)
	f.start(&Reconciler{Estimate: noEstimate(t)})
	f.create(newDeployment("local", "file:///Users/shared/models/q.gguf", 2, "12Gi"))
	for _, r := range f.waitReplicas(2) {
		if r.Spec.MemoryReservation.String() != "12Gi" {
			t.Errorf("%s reserves %s, want 12Gi", r.Name, r.Spec.MemoryReservation.String())
		}
	}
	md := f.waitStatus("local", func(md *v1alpha1.ModelDeployment) (bool, string) {
		return md.Status.EstimatedMemory != nil, fmt.Sprintf("%+v", md.Status)
	})
	if md.Status.EstimatedMemory.String() != "12Gi" {
		t.Errorf("estimatedMemory %s", md.Status.EstimatedMemory.String())
	}
}
