package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/macfleet/macfleet/agent/hardware"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/certsigner/certsignertest"
	"github.com/macfleet/macfleet/internal/credentials"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestAgentCommand runs `macfleet agent` in-process against a real API server with a
// node credential, as on a Mac: it gets its certificate from the manager's signer
// (CertificateSigningRequest), registers its MacNode with the simulated hardware,
// renews its Lease, serves a replica bound to it from the model store over TLS to a
// gateway's certificate only, and shuts down cleanly. Its replica is Ready only once
// it holds its certificate: before the signer runs, it is loaded but Ready False
// (AgentNotServing).
func TestAgentCommand(t *testing.T) {
	rp := os.Getenv(runnerproc.RunnerEnv)
	if rp == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	env := testenv.Start(t, testenv.WithScheme(v1alpha1.AddToScheme))
	ctx := t.Context()
	for _, ns := range []string{v1alpha1.SystemNamespace, v1alpha1.NodeLeaseNamespace, v1alpha1.NodeIdentityNamespace} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	// The node's RBAC (every replica readable: no node authorizer here) and admission
	// policy. The manager's signer starts only once the replica is loaded, so the agent
	// first runs without a serving certificate.
	if err := env.Apply(ctx, "config/agent", "config/agent-replica-reads", "config/admission"); err != nil {
		t.Fatal(err)
	}
	const node = "mac-cmd"
	cred, err := credentials.Issue(ctx, kubernetes.NewForConfigOrDie(env.Config), env.Config, node, credentials.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kc := filepath.Join(dir, "node.kubeconfig")
	if err := os.WriteFile(kc, cred.Kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	model := filepath.Join(dir, "tiny.gguf")
	if err := ggufsynth.Write(model, ggufsynth.Tiny()); err != nil {
		t.Fatal(err)
	}
	// The agent opens file:// sources only under the directories the cluster's
	// SourcePolicy allows.
	if err := env.Client.Create(ctx, &v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SourcePolicyName},
		Spec: v1alpha1.SourcePolicySpec{Rules: []v1alpha1.SourcePolicyRule{{Namespaces: []string{"*"}, FileDirectories: []string{dir}}}}}); err != nil {
		t.Fatal(err)
	}
	// The kernel picks the port as the agent listens, and the agent advertises it:
	// no port is chosen here that another process could take first.
	const anyPort = "127.0.0.1:0"
	cmd := newAgentCmd()
	cmd.SetArgs([]string{"--kubeconfig", kc, "--node-name", node, "--listen", anyPort, "--advertise-address", anyPort,
		"--store-dir", filepath.Join(dir, "models"), "--state-dir", filepath.Join(dir, "state"), "--prompt-cache-dir", filepath.Join(dir, "prompt-cache"), "--runner", rp,
		"--runner-threads", "1", "--memory-ceiling", "2Gi", "--unified-memory", "16Gi", "--chip", "Apple M2",
		"--lease-duration", "8s", "--keep-runners=false"})
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(runCtx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the agent stopped with: %v", err)
			}
		case <-time.After(2 * time.Minute):
			t.Errorf("the agent did not stop within 2m")
		}
	}
	t.Cleanup(stop)

	var mn v1alpha1.MacNode
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		if err := env.Client.Get(ctx, types.NamespacedName{Name: node}, &mn); err != nil {
			return false, err.Error()
		}
		host, port, err := net.SplitHostPort(mn.Status.Agent.Address)
		return err == nil && host == "127.0.0.1" && port != "0", "agent address " + mn.Status.Agent.Address
	})
	addr := mn.Status.Agent.Address
	if mn.Labels[v1alpha1.LabelMemoryGiB] != "16" || mn.Status.Hardware.Chip != "Apple M2" {
		t.Errorf("MacNode labels %v, hardware %+v; want the simulated 16 GiB Apple M2", mn.Labels, mn.Status.Hardware)
	}
	// The thread policy's cores are the host's own, not a simulated Mac's.
	if got := int(mn.Status.Hardware.PerformanceCores); got != hardware.PerformanceCores() {
		t.Errorf("MacNode performanceCores %d, want this host's %d", got, hardware.PerformanceCores())
	}
	var lease coordinationv1.Lease
	if err := env.Client.Get(ctx, types.NamespacedName{Namespace: v1alpha1.NodeLeaseNamespace, Name: node}, &lease); err != nil {
		t.Errorf("the node's Lease: %v", err)
	}

	ns := testenv.NewNamespace(t, env.Client)
	mr := &v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tiny-0", Labels: map[string]string{v1alpha1.LabelDeployment: "tiny"}},
		Spec: v1alpha1.ModelReplicaSpec{
			Template: v1alpha1.ModelReplicaTemplate{Model: v1alpha1.ModelSource{Source: "file://" + model},
				Engine: v1alpha1.EngineSpec{Settings: engine.Settings{ContextLength: 512, Parallel: 1}}, Residency: v1alpha1.ResidencyResident},
			TemplateHash: "h1", MemoryReservation: resource.MustParse("512Mi"), NodeName: node,
		},
	}
	if err := env.Client.Create(ctx, mr); err != nil {
		t.Fatal(err)
	}
	// Loaded, but not Ready while the agent cannot answer: it has no certificate yet.
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "tiny-0"}, mr); err != nil {
			return false, err.Error()
		}
		b, _ := json.Marshal(mr.Status)
		if c := meta.FindStatusCondition(mr.Status.Conditions, v1alpha1.ReplicaReady); c != nil && c.Status == metav1.ConditionTrue {
			t.Fatalf("the replica is Ready before its agent has a serving certificate: %s", b)
		}
		ready := meta.FindStatusCondition(mr.Status.Conditions, v1alpha1.ReplicaReady)
		return meta.IsStatusConditionTrue(mr.Status.Conditions, v1alpha1.ReplicaLoaded) && ready != nil &&
			ready.Reason == v1alpha1.ReasonAgentNotServing, string(b)
	})
	authority := certsignertest.Start(t, env)
	testenv.Eventually(t, time.Minute, 100*time.Millisecond, func() (bool, string) {
		if err := env.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "tiny-0"}, mr); err != nil {
			return false, err.Error()
		}
		b, _ := json.Marshal(mr.Status)
		return meta.IsStatusConditionTrue(mr.Status.Conditions, v1alpha1.ReplicaReady) && mr.Status.Endpoint == addr, string(b)
	})

	// A gateway's certificate, and none at all.
	clientOf := func(src *pki.Source) *http.Client {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = src.ClientConfig(pki.Node(node))
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	gw := clientOf(certsignertest.Source(t, authority, pki.Gateway("macfleet-gateway")))
	anon := &pki.Source{}
	if err := anon.SetBundle(pki.EncodeCerts(authority.Bundle()...)); err != nil {
		t.Fatal(err)
	}
	stranger := clientOf(anon)
	chat := func(hc *http.Client) int {
		body := []byte(`{"model":"tiny","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr+"/v1/chat/completions", bytes.NewReader(body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if code := chat(stranger); code != http.StatusUnauthorized {
		t.Errorf("chat without a client certificate: %d, want 401", code)
	}
	if code := chat(gw); code != http.StatusOK {
		t.Errorf("chat with a gateway's certificate: %d, want 200", code)
	}

	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/api/status", nil)
	resp, err := gw.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Models []struct {
			PID int `json:"pid"`
		} `json:"models"`
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || len(st.Models) != 1 || st.Models[0].PID == 0 {
		t.Fatalf("/api/status: %+v %v", st, err)
	}

	stop()
	// --keep-runners=false: the runner went with the agent.
	if err := syscall.Kill(st.Models[0].PID, 0); err == nil {
		t.Errorf("runner pid %d still runs after the agent stopped with --keep-runners=false", st.Models[0].PID)
	}
	if err := env.Client.Get(ctx, types.NamespacedName{Name: node}, &mn); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(mn.Status.Conditions, v1alpha1.MacNodeReady); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("MacNode Ready after the agent stopped: %+v, want False", c)
	}
	if _, err := stranger.Get("https://" + addr + "/healthz"); err == nil {
		t.Errorf("the agent still serves on %s after it stopped", addr)
	}
}
