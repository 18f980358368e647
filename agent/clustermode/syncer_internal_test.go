package clustermode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// pathStore returns file:// paths as they are.
type pathStore struct{}

func (pathStore) Fetch(_ context.Context, _, source, _ string, progress func(done, total int64)) (string, error) {
	p := source[len("file://"):]
	fi, err := os.Stat(p)
	if err != nil {
		return "", err
	}
	progress(fi.Size(), fi.Size())
	return p, nil
}

// TestUpdateInPlace drives one replica through template changes the API server only
// lets happen by replacing the replica (its template is immutable), which the agent
// sees as one update when its watch missed the delete: engine settings reload the
// engine, residency applies in place, a new file starts over, deletion removes it.
func TestUpdateInPlace(t *testing.T) {
	rp := os.Getenv(runnerproc.RunnerEnv)
	if rp == "" {
		t.Skip("MACFLEET_RUNNER is not set")
	}
	dir := t.TempDir()
	model := filepath.Join(dir, "a.gguf")
	if err := ggufsynth.Write(model, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "b.gguf")
	if err := os.Link(model, other); err != nil {
		t.Fatal(err)
	}
	gauge, err := enginepool.NewGauge()
	if err != nil {
		t.Fatal(err)
	}
	pool, err := enginepool.New(enginepool.Config{CeilingBytes: 4 << 30, DrainTimeout: 5 * time.Second, StopGrace: 3 * time.Second,
		BackoffInitial: 100 * time.Millisecond, SettleTimeout: time.Second},
		runnerproc.NewProcessFactory(runnerproc.ProcessConfig{RunnerPath: rp, Threads: 1, SocketDir: t.TempDir()}), gauge, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := pool.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	mr := &v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "r-0", UID: "u1", Labels: map[string]string{v1alpha1.LabelDeployment: "d"}},
		Spec: v1alpha1.ModelReplicaSpec{
			Template: v1alpha1.ModelReplicaTemplate{Model: v1alpha1.ModelSource{Source: "file://" + model},
				Engine: v1alpha1.EngineSpec{Settings: engine.Settings{ContextLength: 512, Parallel: 1, KVCacheType: v1alpha1.KVCacheF16}}, Residency: v1alpha1.ResidencyResident},
			TemplateHash: "h1", MemoryReservation: resource.MustParse("512Mi"), NodeName: "mac",
		},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(mr).WithStatusSubresource(mr).Build()
	inf := toolscache.NewSharedIndexInformer(&toolscache.ListWatch{}, &v1alpha1.ModelReplica{}, 0, toolscache.Indexers{})
	s, err := NewSyncer(SyncerOptions{NodeName: "mac", Endpoint: "e:1", Cache: c, Informer: inf, Client: c, Pool: pool,
		Store: pathStore{}, Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.queue.ShutDown)
	ctx := t.Context()
	const key = "ns/r-0"

	// drive runs sync passes until cond holds for the pool entry (nil when absent).
	drive := func(what string, cond func(m *enginepool.ModelSnapshot) bool) *enginepool.ModelSnapshot {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			if _, err := s.sync(ctx, key); err != nil {
				t.Fatalf("%s: sync: %v", what, err)
			}
			m := findModel(pool.Snapshot(), key)
			if cond(m) {
				return m
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not reached within 1m; pool entry %+v", what, m)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	update := func(edit func(*v1alpha1.ModelReplica)) {
		t.Helper()
		var cur v1alpha1.ModelReplica
		if err := c.Get(ctx, client.ObjectKeyFromObject(mr), &cur); err != nil {
			t.Fatal(err)
		}
		edit(&cur)
		if err := c.Update(ctx, &cur); err != nil {
			t.Fatal(err)
		}
	}
	loaded := func(m *enginepool.ModelSnapshot) bool { return m != nil && m.State == enginepool.StateReady }

	m := drive("load", loaded)
	pid := m.PID

	update(func(r *v1alpha1.ModelReplica) {
		r.Spec.TemplateHash, r.Spec.Template.Engine.ContextLength = "h2", 1024
	})
	m = drive("reload with the new context", func(m *enginepool.ModelSnapshot) bool {
		return loaded(m) && m.LoadedSpec != nil && m.LoadedSpec.Engine.TotalContext() == 1024
	})
	if m.PID == pid {
		t.Errorf("the engine kept pid %d though its context length changed", pid)
	}
	pid = m.PID

	update(func(r *v1alpha1.ModelReplica) {
		r.Spec.TemplateHash, r.Spec.Template.Residency = "h3", v1alpha1.ResidencyOnDemand
	})
	m = drive("residency in place", func(m *enginepool.ModelSnapshot) bool { return loaded(m) && m.Residency == enginepool.OnDemand })
	if m.PID != pid {
		t.Errorf("the engine was restarted (pid %d -> %d) for a residency change", pid, m.PID)
	}

	update(func(r *v1alpha1.ModelReplica) {
		r.UID, r.Spec.TemplateHash, r.Spec.Template.Model.Source = "u2", "h4", "file://"+other
		r.Spec.Template.Residency = v1alpha1.ResidencyPinned
	})
	drive("the new file loaded", func(m *enginepool.ModelSnapshot) bool {
		return loaded(m) && m.LoadedSpec.Path == other && m.Residency == enginepool.Pinned
	})
	s.mu.Lock()
	got := fmt.Sprint(s.replicas[key].hash, " ", s.replicas[key].uid)
	s.mu.Unlock()
	if got != "h4 u2" {
		t.Errorf("local record %s, want h4 u2", got)
	}

	if err := c.Delete(ctx, mr); err != nil {
		t.Fatal(err)
	}
	drive("removed", func(m *enginepool.ModelSnapshot) bool { return m == nil })
	if n := pool.Snapshot().Runners; n != 0 {
		t.Errorf("%d runners left after the replica was deleted", n)
	}
}
