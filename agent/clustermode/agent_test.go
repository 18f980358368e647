package clustermode_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// errorCode is the OpenAI error code of a response body.
func errorCode(body string) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &e)
	return e.Error.Code
}

// TestResidentReplica: a Resident replica bound to the node is downloaded, loaded and
// reported Ready with its endpoint and memory; requests need the fleet token and
// find the replica by header or served name; deleting the replica unloads it and
// removes it from the pool. A replica bound to another node is not touched.
func TestResidentReplica(t *testing.T) {
	a := startAgent(t, agentOptions{})
	ns := testenv.NewNamespace(t, env.Client)
	mine := newReplica(t, ns, "tiny-0", a.node, replicaOpts{servedName: "tiny"})
	newReplica(t, ns, "tiny-1", "another-mac", replicaOpts{servedName: "tiny"})
	key := ns + "/tiny-0"

	mr := waitReplica(t, time.Minute, ns, "tiny-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return allOf(
			func() (bool, string) {
				return condIs(mr, v1alpha1.ReplicaDownloaded, metav1.ConditionTrue, v1alpha1.ReasonStored)
			},
			func() (bool, string) {
				return condIs(mr, v1alpha1.ReplicaLoaded, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady)
			},
			func() (bool, string) {
				return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady)
			},
			func() (bool, string) {
				return mr.Status.Memory.Resident != nil && mr.Status.Memory.Resident.Value() > 0, "no resident memory"
			},
		)
	})
	if mr.Status.Endpoint != a.endpoint || mr.Status.Phase != v1alpha1.ReplicaRunning || mr.Status.ObservedTemplateHash != "h1" {
		t.Errorf("endpoint %q phase %s observedTemplateHash %q; want %q Ready h1", mr.Status.Endpoint, mr.Status.Phase,
			mr.Status.ObservedTemplateHash, a.endpoint)
	}
	if e := mr.Status.Memory.Estimated; e == nil || e.Value() != 512<<20 {
		t.Errorf("memory.estimated %v, want the reservation 512Mi", e)
	}
	if p := mr.Status.Memory.Peak; p == nil || p.Value() < mr.Status.Memory.Resident.Value() {
		t.Errorf("memory.peak %v below resident %v", p, mr.Status.Memory.Resident)
	}
	if p := mr.Status.Progress; p == nil || p.TotalBytes <= 0 || p.DownloadedBytes != p.TotalBytes {
		t.Errorf("progress %+v, want the whole file", p)
	}

	tests := []struct {
		name   string
		model  string
		header []string
		want   int
		code   string
	}{
		{name: "no token", model: "tiny", want: http.StatusUnauthorized, code: "invalid_api_key"},
		{name: "wrong token", model: "tiny", header: []string{"Authorization", "Bearer nope"}, want: http.StatusUnauthorized,
			code: "invalid_api_key"},
		{name: "by served name", model: "tiny", header: auth, want: http.StatusOK},
		{name: "by namespace/served name", model: ns + "/tiny", header: auth, want: http.StatusOK},
		{name: "by replica header", model: "anything", header: append([]string{v1alpha1.HeaderReplica, key}, auth...),
			want: http.StatusOK},
		{name: "unknown replica header", model: "tiny", header: append([]string{v1alpha1.HeaderReplica, ns + "/tiny-1"}, auth...),
			want: http.StatusNotFound, code: enginepool.CodeModelNotFound},
		{name: "unknown model", model: "gpt-9", header: auth, want: http.StatusNotFound, code: enginepool.CodeModelNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := a.chat(tt.model, tt.header...)
			if code != tt.want {
				t.Fatalf("status %d, want %d: %s", code, tt.want, body)
			}
			if tt.code != "" && errorCode(body) != tt.code {
				t.Errorf("error code %q, want %q: %s", errorCode(body), tt.code, body)
			}
			if code == http.StatusOK && !strings.Contains(body, fmt.Sprintf(`"model":%q`, tt.model)) {
				t.Errorf("the response does not name the requested model %q: %s", tt.model, body)
			}
		})
	}
	for _, p := range []string{"/api/status", "/metrics", "/v1/models"} {
		if resp, b := a.do(http.MethodGet, p, nil); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %d %s", p, resp.StatusCode, b)
		}
	}
	if resp, b := a.do(http.MethodGet, "/healthz", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz without the token: %d %s", resp.StatusCode, b)
	}
	if resp, b := a.do(http.MethodGet, "/v1/models", nil, auth...); resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"id":"tiny"`) {
		t.Errorf("GET /v1/models: %d %s; want the served name", resp.StatusCode, b)
	}
	if other := getReplica(t, ns, "tiny-1"); len(other.Status.Conditions) != 0 || other.Status.Endpoint != "" {
		t.Errorf("the agent wrote the status of a replica bound to another node: %s", statusJSON(other))
	}

	m, ok := a.model(key)
	if !ok || m.PID == 0 {
		t.Fatalf("pool entry %s: %+v", key, m)
	}
	// A new template hash for the same template: the agent acts on it in place.
	mine = getReplica(t, ns, "tiny-0")
	mine.Spec.TemplateHash = "h1b"
	if err := env.Client.Update(t.Context(), mine); err != nil {
		t.Fatal(err)
	}
	waitReplica(t, time.Minute, ns, "tiny-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		if mr.Status.ObservedTemplateHash != "h1b" {
			return false, "observedTemplateHash " + mr.Status.ObservedTemplateHash
		}
		return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady)
	})
	if m2, _ := a.model(key); m2.PID != m.PID {
		t.Errorf("the engine was restarted (pid %d -> %d) for a hash change that changes no setting", m.PID, m2.PID)
	}
	if err := env.Client.Delete(t.Context(), mine); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		s := a.status()
		_, present := a.model(key)
		return !present && s.Runners == 0, fmt.Sprintf("entry present %v, %d runners", present, s.Runners)
	})
	if err := processGone(m.PID); err != nil {
		t.Error(err)
	}
	if code, body := a.chat("tiny", auth...); code != http.StatusNotFound {
		t.Errorf("chat after the replica was deleted: %d %s; want 404", code, body)
	}
}

// processGone checks that pid has exited.
func processGone(pid int) error {
	b, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "stat"))
	if err != nil {
		return nil
	}
	if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
		return nil
	}
	return fmt.Errorf("runner pid %d still runs", pid)
}

// TestOnDemandReplica: an OnDemand replica is Ready (WaitingForDemand) once stored,
// loads on its first request, and its idle unload is reported in status.lastUnload.
// A served name shared by two deployments is ambiguous; an alias is not.
func TestOnDemandReplica(t *testing.T) {
	a := startAgent(t, agentOptions{})
	ns := testenv.NewNamespace(t, env.Client)
	newReplica(t, ns, "a-0", a.node, replicaOpts{deployment: "a", servedName: "shared",
		residency: v1alpha1.ResidencyOnDemand, idle: time.Second})
	b := newReplica(t, ns, "b-0", a.node, replicaOpts{deployment: "b", servedName: "shared",
		residency: v1alpha1.ResidencyOnDemand, idle: 30 * time.Second})
	b.Spec.Template.Model.Aliases = nil
	for _, name := range []string{"a-0", "b-0"} {
		mr := waitReplica(t, time.Minute, ns, name, func(mr *v1alpha1.ModelReplica) (bool, string) {
			return allOf(
				func() (bool, string) {
					return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonWaitingForDemand)
				},
				func() (bool, string) {
					return condIs(mr, v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonUnloaded)
				},
			)
		})
		if mr.Status.Phase != v1alpha1.ReplicaStandby || mr.Status.Endpoint != a.endpoint {
			t.Errorf("%s: phase %s endpoint %q, want Standby at %s", name, mr.Status.Phase, mr.Status.Endpoint, a.endpoint)
		}
		if m, ok := a.model(ns + "/" + name); !ok || m.State != enginepool.StateAbsent {
			t.Errorf("%s: pool entry %+v, want registered and not loaded", name, m)
		}
	}

	code, body := a.chat("shared", auth...)
	if code != http.StatusBadRequest || errorCode(body) != "model_ambiguous" || !strings.Contains(body, ns+"/a") {
		t.Errorf("chat to a name two deployments serve: %d %s; want 400 model_ambiguous naming them", code, body)
	}
	// The gateway names the replica: the first request loads it.
	if code, body := a.chat("shared", append([]string{v1alpha1.HeaderReplica, ns + "/a-0"}, auth...)...); code != http.StatusOK {
		t.Fatalf("chat to a-0 by header: %d %s", code, body)
	}
	waitReplica(t, time.Minute, ns, "a-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		if mr.Status.LastUnload == nil {
			return false, "no lastUnload yet"
		}
		u := mr.Status.LastUnload
		if u.Reason != "Idle" || u.Outcome == "" || u.ResidentBytes <= 0 {
			return false, fmt.Sprintf("lastUnload %+v, want an idle unload with its measurement", u)
		}
		return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonWaitingForDemand)
	})
	mr := getReplica(t, ns, "a-0")
	t.Logf("idle unload: freed %d bytes of %d resident, outcome %s, in %s", mr.Status.LastUnload.FreedBytes,
		mr.Status.LastUnload.ResidentBytes, mr.Status.LastUnload.Outcome, mr.Status.LastUnload.Duration.Duration)
	// freedBytes of a model this small is within the settle tolerance (it may be 0);
	// the outcome and the resident bytes are the measurement.
	if mr.Status.Phase != v1alpha1.ReplicaStandby {
		t.Errorf("phase after the idle unload %s, want Standby", mr.Status.Phase)
	}
	if m, _ := a.model(ns + "/b-0"); m.State != enginepool.StateAbsent {
		t.Errorf("b-0 is %s; only a-0 was asked for", m.State)
	}
}

// TestDownloadFailureRetries: a missing file and a checksum mismatch are reported in
// the Downloaded condition and retried with backoff; once the file is there the
// replica becomes Ready without any change to it.
func TestDownloadFailureRetries(t *testing.T) {
	a := startAgent(t, agentOptions{})
	ns := testenv.NewNamespace(t, env.Client)
	later := filepath.Join(t.TempDir(), "later.gguf")
	newReplica(t, ns, "missing-0", a.node, replicaOpts{source: "file://" + later})
	newReplica(t, ns, "corrupt-0", a.node, replicaOpts{sha: strings.Repeat("0", 64)})

	waitReplica(t, time.Minute, ns, "corrupt-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		ok, msg := condIs(mr, v1alpha1.ReplicaDownloaded, metav1.ConditionFalse, v1alpha1.ReasonChecksumMismatch)
		return ok && mr.Status.Phase == v1alpha1.ReplicaFailed, msg
	})
	mr := waitReplica(t, time.Minute, ns, "missing-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaDownloaded, metav1.ConditionFalse, v1alpha1.ReasonDownloadFailed)
	})
	for _, c := range mr.Status.Conditions {
		// "… retrying at T" until the retry starts, "retrying (downloading …) after: …"
		// while it runs.
		if c.Type == v1alpha1.ReplicaDownloaded && (!strings.Contains(c.Message, "later.gguf") || !strings.Contains(c.Message, "retrying")) {
			t.Errorf("Downloaded message %q should name the file and the retry", c.Message)
		}
	}
	if code, body := a.chat("tiny", append([]string{v1alpha1.HeaderReplica, ns + "/missing-0"}, auth...)...); code != http.StatusServiceUnavailable {
		t.Errorf("chat to a replica not downloaded: %d %s; want 503", code, body)
	}
	b, err := os.ReadFile(tinyModel)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(later, b, 0o644); err != nil {
		t.Fatal(err)
	}
	waitReplica(t, time.Minute, ns, "missing-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady)
	})
}

// TestAPIServerOutage: with the API server unreachable the agent keeps serving —
// including an OnDemand load and its idle unload — and a replica replaced meanwhile
// by one of another template (same name, OnDemand instead of Resident) is acted on
// once the API server is back; the statuses catch up.
func TestAPIServerOutage(t *testing.T) {
	rc, proxy := throughProxy(t)
	a := startAgent(t, agentOptions{rest: rc})
	ns := testenv.NewNamespace(t, env.Client)
	res := newReplica(t, ns, "res-0", a.node, replicaOpts{deployment: "res", servedName: "res"})
	newReplica(t, ns, "od-0", a.node, replicaOpts{deployment: "od", servedName: "od",
		residency: v1alpha1.ResidencyOnDemand, idle: time.Second})
	waitReplica(t, time.Minute, ns, "res-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady)
	})
	waitReplica(t, time.Minute, ns, "od-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonWaitingForDemand)
	})
	before, _ := a.model(ns + "/res-0")

	proxy.Cut()
	for _, model := range []string{"res", "od"} {
		if code, body := a.chat(model, auth...); code != http.StatusOK {
			t.Fatalf("chat to %s with the API server unreachable: %d %s", model, code, body)
		}
	}
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		m, _ := a.model(ns + "/od-0")
		return m.LastUnload != nil, "od-0 not unloaded yet: " + string(m.State)
	})
	// Replace res-0 by a replica of a new template while the agent cannot see it.
	if err := env.Client.Delete(t.Context(), res); err != nil {
		t.Fatal(err)
	}
	newReplica(t, ns, "res-0", a.node, replicaOpts{deployment: "res", servedName: "res", hash: "h2",
		residency: v1alpha1.ResidencyOnDemand, idle: time.Hour})
	if code, body := a.chat("res", auth...); code != http.StatusOK {
		t.Fatalf("chat to res while still cut off: %d %s", code, body)
	}
	if got := getReplica(t, ns, "od-0"); got.Status.LastUnload != nil {
		t.Fatalf("lastUnload written with the API server cut off? %s", statusJSON(got))
	}
	if err := proxy.Restore(); err != nil {
		t.Fatal(err)
	}

	waitReplica(t, time.Minute, ns, "od-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		if u := mr.Status.LastUnload; u == nil || u.Reason != "Idle" {
			return false, "no idle unload reported"
		}
		return true, ""
	})
	waitReplica(t, time.Minute, ns, "res-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		if mr.Status.ObservedTemplateHash != "h2" {
			return false, "observedTemplateHash " + mr.Status.ObservedTemplateHash
		}
		// RunnerReady when the engine was kept, WaitingForDemand when it was unloaded.
		if !meta.IsStatusConditionTrue(mr.Status.Conditions, v1alpha1.ReplicaReady) {
			return false, "not Ready"
		}
		return true, ""
	})
	// The watch may deliver the delete and the create separately (unload, then load
	// again) or the relist may fold them into one update (the engine is kept).
	after, _ := a.model(ns + "/res-0")
	if after.Residency != enginepool.OnDemand {
		t.Errorf("after the template change the entry is %s, want OnDemand", after.Residency)
	}
	t.Logf("engine pid %d before the change, %d after", before.PID, after.PID)
	if !slices.ContainsFunc(a.status().Models, func(m enginepool.ModelSnapshot) bool { return m.Name == ns+"/od-0" }) {
		t.Errorf("od-0 left the pool")
	}
}

// TestHTTPSourceThroughStore: a replica whose model comes over HTTP is downloaded by
// the real model store, verified against its sha256, and served; a second replica of
// the same file shares the stored copy.
func TestHTTPSourceThroughStore(t *testing.T) {
	b, err := os.ReadFile(tinyModel)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	var gets atomic.Int64
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			gets.Add(1)
		}
		http.ServeContent(w, r, "tiny.gguf", time.Time{}, bytes.NewReader(b))
	}))
	t.Cleanup(hs.Close)
	st, err := store.New(t.TempDir(), store.Options{Policy: loopbackPolicy(t)})
	if err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, agentOptions{store: st})
	ns := testenv.NewNamespace(t, env.Client)
	src := hs.URL + "/models/tiny.gguf"
	newReplica(t, ns, "web-0", a.node, replicaOpts{deployment: "web", source: src, sha: hex.EncodeToString(sum[:])})
	mr := waitReplica(t, time.Minute, ns, "web-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady)
	})
	if p := mr.Status.Progress; p == nil || p.TotalBytes != int64(len(b)) || p.DownloadedBytes != p.TotalBytes {
		t.Errorf("progress %+v, want %d of %d bytes", p, len(b), len(b))
	}
	newReplica(t, ns, "web-1", a.node, replicaOpts{deployment: "web", source: src, sha: hex.EncodeToString(sum[:]),
		residency: v1alpha1.ResidencyOnDemand})
	waitReplica(t, time.Minute, ns, "web-1", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonWaitingForDemand)
	})
	if n := gets.Load(); n != 1 {
		t.Errorf("the model was downloaded %d times, want once for both replicas", n)
	}
	if code, body := a.chat("web", auth...); code != http.StatusOK {
		t.Errorf("chat: %d %s", code, body)
	}
}

// TestRestartAdoptsRunners: with a state directory, a stopped agent leaves its
// runners running; the next agent of the node adopts the runners of replicas still
// bound (same processes, a loaded OnDemand one included) and stops the runner of a
// replica that was deleted meanwhile.
func TestRestartAdoptsRunners(t *testing.T) {
	stateDir := t.TempDir()
	a1 := startAgent(t, agentOptions{stateDir: stateDir})
	ns := testenv.NewNamespace(t, env.Client)
	newReplica(t, ns, "keep-0", a1.node, replicaOpts{deployment: "keep", servedName: "keep"})
	gone := newReplica(t, ns, "gone-0", a1.node, replicaOpts{deployment: "gone", servedName: "gone"})
	newReplica(t, ns, "od-0", a1.node, replicaOpts{deployment: "od", servedName: "od",
		residency: v1alpha1.ResidencyOnDemand, idle: time.Hour})
	for _, name := range []string{"keep-0", "gone-0"} {
		waitReplica(t, time.Minute, ns, name, func(mr *v1alpha1.ModelReplica) (bool, string) {
			return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady)
		})
	}
	waitReplica(t, time.Minute, ns, "od-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonWaitingForDemand)
	})
	if code, body := a1.chat("od", auth...); code != http.StatusOK {
		t.Fatalf("chat to the OnDemand replica: %d %s", code, body)
	}
	keep, _ := a1.model(ns + "/keep-0")
	old, _ := a1.model(ns + "/gone-0")
	od, _ := a1.model(ns + "/od-0")
	t.Cleanup(func() {
		// Runners left by the last agent of the test.
		for _, pid := range []int{keep.PID, old.PID, od.PID} {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	a1.stop()
	for _, pid := range []int{keep.PID, old.PID, od.PID} {
		if processGone(pid) == nil {
			t.Fatalf("runner pid %d exited with the agent; it should be left for the next one", pid)
		}
	}
	if err := env.Client.Delete(t.Context(), gone); err != nil {
		t.Fatal(err)
	}

	a2 := startAgent(t, agentOptions{node: a1.node, stateDir: stateDir})
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		m, ok := a2.model(ns + "/keep-0")
		return ok && m.State == enginepool.StateReady, fmt.Sprintf("keep-0 in the new agent: %v %s", ok, m.State)
	})
	if m, _ := a2.model(ns + "/keep-0"); m.PID != keep.PID {
		t.Errorf("keep-0 runs in pid %d after the restart, want the adopted %d", m.PID, keep.PID)
	}
	// The OnDemand replica's runner is adopted too, not stopped.
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		m, ok := a2.model(ns + "/od-0")
		return ok && m.State == enginepool.StateReady && m.PID == od.PID,
			fmt.Sprintf("od-0 in the new agent: %v %s pid %d (was %d)", ok, m.State, m.PID, od.PID)
	})
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		err := processGone(old.PID)
		return err == nil, fmt.Sprint(err)
	})
	for _, model := range []string{"keep", "od"} {
		if code, body := a2.chat(model, auth...); code != http.StatusOK {
			t.Errorf("chat to the adopted runner of %s: %d %s", model, code, body)
		}
	}
	if m, _ := a2.model(ns + "/od-0"); m.PID != od.PID {
		t.Errorf("od-0 runs in pid %d, want the adopted %d", m.PID, od.PID)
	}
	waitReplica(t, time.Minute, ns, "keep-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady)
	})
}

// TestLoadRefusedBacksOff: a Resident replica the pool cannot admit (its reservation
// exceeds the node's ceiling) reports LoadFailed with the pool's reason and is retried
// with backoff, not in a loop.
func TestLoadRefusedBacksOff(t *testing.T) {
	a := startAgent(t, agentOptions{})
	ns := testenv.NewNamespace(t, env.Client)
	newReplica(t, ns, "big-0", a.node, replicaOpts{reservation: "8Gi"})
	mr := waitReplica(t, time.Minute, ns, "big-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonLoadFailed)
	})
	if ok, msg := condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionFalse, v1alpha1.ReasonLoadFailed); !ok || mr.Status.Phase != v1alpha1.ReplicaFailed {
		t.Errorf("Ready/phase: %s %s", msg, mr.Status.Phase)
	}
	c := meta.FindStatusCondition(mr.Status.Conditions, v1alpha1.ReplicaLoaded)
	if !strings.Contains(c.Message, "pool ceiling") || !strings.Contains(c.Message, "retrying at") {
		t.Errorf("Loaded message %q should give the pool's reason and the retry", c.Message)
	}
	start := time.Now()
	attempts := func() int {
		n := 0
		for _, l := range strings.Split(a.logs.String(), "\n") {
			if strings.Contains(l, `"Loading the model failed"`) && strings.Contains(l, `"replica"="`+ns+`/big-0"`) {
				n++
			}
		}
		return n
	}
	first := attempts()
	// Backoff 1s, 2s, 4s...: within 3.5s at most three more attempts; a loop would
	// make hundreds.
	testenv.Eventually(t, 10*time.Second, 100*time.Millisecond, func() (bool, string) {
		return time.Since(start) > 3500*time.Millisecond, ""
	})
	if n := attempts() - first; n < 1 || n > 3 {
		t.Errorf("%d load attempts in 3.5s after the first failure; want a backoff of 1s, 2s, ...", n)
	}
}

// TestOnDemandRunnerCrashReadyAgain: an OnDemand replica whose runner crashed is
// Failed during the pool's backoff, then Ready again (WaitingForDemand) without any
// request: the gateway only routes to Ready replicas, so a replica waiting for its
// next request to load it must be Ready (the soak found one left Failed for good).
func TestOnDemandRunnerCrashReadyAgain(t *testing.T) {
	a := startAgent(t, agentOptions{})
	ns := testenv.NewNamespace(t, env.Client)
	newReplica(t, ns, "od-0", a.node, replicaOpts{deployment: "od", servedName: "od",
		residency: v1alpha1.ResidencyOnDemand, idle: time.Hour})
	waitReplica(t, time.Minute, ns, "od-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonWaitingForDemand)
	})
	if code, body := a.chat("od", auth...); code != http.StatusOK {
		t.Fatalf("chat to the OnDemand replica: %d %s", code, body)
	}
	m, ok := a.model(ns + "/od-0")
	if !ok || m.PID == 0 {
		t.Fatalf("pool entry %+v, want a loaded runner", m)
	}
	if err := syscall.Kill(m.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitReplica(t, time.Minute, ns, "od-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonLoadFailed)
	})
	mr := waitReplica(t, time.Minute, ns, "od-0", func(mr *v1alpha1.ModelReplica) (bool, string) {
		return condIs(mr, v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonWaitingForDemand)
	})
	if mr.Status.Phase != v1alpha1.ReplicaStandby {
		t.Errorf("phase %s after the backoff, want Standby", mr.Status.Phase)
	}
	if code, body := a.chat("od", auth...); code != http.StatusOK {
		t.Errorf("chat after the crash: %d %s", code, body)
	}
}
