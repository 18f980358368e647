// Package e2e runs a whole fleet on this machine — kube-apiserver and etcd, `macfleet
// manager`, two replicas of `macfleet gateway`, two `macfleet agent`s simulating Macs, real runner
// processes on a synthesized model — and drives it as users do: manifests in, OpenAI
// requests out (test/support/localfleet starts it).
//
// The tests share one fleet and run in order; each uses its own namespace. The last
// one kills an agent.
package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

const (
	leaseDuration = 10 * time.Second
	nodeLossGrace = 15 * time.Second
	modelFile     = "tiny.gguf"
)

var fleet *localfleet.Fleet

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "macfleet-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if os.Getenv("MACFLEET_E2E_KEEP") != "" {
		// The fleet's logs, kubeconfigs and stores stay for a post-mortem.
		defer fmt.Fprintf(os.Stderr, "e2e: the fleet's files are kept in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	bin, runner, err := localfleet.Binaries(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := &strings.Builder{}
	var managerArgs []string
	if v := os.Getenv("MACFLEET_E2E_MANAGER_LOG_LEVEL"); v != "" {
		// With MACFLEET_E2E_KEEP, e.g. 2 keeps every autoscaler measurement in the
		// manager's log (docs/benchmarks.md, "The autoscaler's load samples").
		managerArgs = append(managerArgs, "--zap-log-level="+v)
	}
	fleet, err = localfleet.Start(ctx, localfleet.Options{Binary: bin, Runner: runner, Dir: filepath.Join(dir, "fleet"),
		LeaseDuration: leaseDuration, NodeLossGrace: nodeLossGrace, Gateways: 2, ManagerArgs: managerArgs, Hub: true, Log: log})
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: starting the fleet: %v\n%s", err, log)
		dumpLogs(filepath.Join(dir, "fleet", "logs"))
		return 1
	}
	if err := ggufsynth.Write(filepath.Join(fleet.ModelsDir, modelFile), ggufsynth.Tiny()); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		fleet.Stop()
		return 1
	}
	code := m.Run()
	if code != 0 {
		dumpLogs(fleet.LogDir())
	}
	fleet.Stop()
	return code
}

// dumpLogs prints the tail of every component's log, for a failed run.
func dumpLogs(dir string) { localfleet.DumpLogs(os.Stderr, dir, 60) }

// deployment is a ModelDeployment of the synthesized model.
func deployment(ns, name string, replicas int32, mutate ...func(*v1alpha1.ModelDeployment)) *v1alpha1.ModelDeployment {
	md := &v1alpha1.ModelDeployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ModelDeploymentSpec{
			Model:    v1alpha1.ModelSource{Source: fleet.ModelsURL + "/" + modelFile},
			Engine:   v1alpha1.EngineSpec{Settings: engine.Settings{ContextLength: 512, Parallel: 2}},
			Replicas: ptr.To(replicas),
		},
	}
	for _, m := range mutate {
		m(md)
	}
	return md
}

// create creates obj on the fleet. A ModelDeployment is removed with its replicas when
// the test ends, so that the memory its replicas reserve on the two simulated Macs is
// free for the tests after it.
func create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := fleet.Client.Create(t.Context(), obj); err != nil {
		t.Fatal(err)
	}
	if md, ok := obj.(*v1alpha1.ModelDeployment); ok {
		t.Cleanup(func() { removeDeployment(t, md.Namespace, md.Name) })
	}
}

// removeDeployment deletes a deployment and its replicas. The local fleet has no
// garbage collector (no kube-controller-manager) to delete the replicas a deployment
// owns, nor a namespace controller to empty a deleted namespace: without this, every
// test's replicas would keep their Macs' memory reserved until the suite ends.
func removeDeployment(t testing.TB, ns, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	md := &v1alpha1.ModelDeployment{}
	md.Namespace, md.Name = ns, name
	if err := fleet.Client.Delete(ctx, md); client.IgnoreNotFound(err) != nil {
		t.Errorf("deleting deployment %s/%s: %v", ns, name, err)
	}
	if err := fleet.Client.DeleteAllOf(ctx, &v1alpha1.ModelReplica{}, client.InNamespace(ns),
		client.MatchingLabels{v1alpha1.LabelDeployment: name}); err != nil {
		t.Errorf("deleting the replicas of %s/%s: %v", ns, name, err)
	}
}

// waitReady waits until the manager has seen the deployment's latest spec and it has
// want ready replicas, all of the current template, and returns its replicas.
func waitReady(t testing.TB, ns, name string, want int32, timeout time.Duration) []v1alpha1.ModelReplica {
	t.Helper()
	var replicas []v1alpha1.ModelReplica
	testenv.Eventually(t, timeout, 200*time.Millisecond, func() (bool, string) {
		var md v1alpha1.ModelDeployment
		if err := fleet.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &md); err != nil {
			return false, err.Error()
		}
		var list v1alpha1.ModelReplicaList
		if err := fleet.Client.List(t.Context(), &list, client.InNamespace(ns),
			client.MatchingLabels{v1alpha1.LabelDeployment: name}); err != nil {
			return false, err.Error()
		}
		replicas = list.Items
		ready := 0
		for _, r := range list.Items {
			if conditionTrue(r.Status.Conditions, v1alpha1.ReplicaReady) {
				ready++
			}
		}
		s := md.Status
		// Until the manager has observed the latest generation, the counts describe the
		// previous template.
		done := s.ObservedGeneration == md.Generation &&
			s.ReadyReplicas == want && s.UpdatedReplicas == want && int32(len(list.Items)) == want && int32(ready) == want
		return done, fmt.Sprintf("deployment %s/%s (generation %d): status %+v; %d replicas, %d Ready: %s", ns, name, md.Generation, s, len(list.Items), ready,
			describeReplicas(list.Items))
	})
	return replicas
}

func describeReplicas(rs []v1alpha1.ModelReplica) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, "\n  %s node=%q phase=%s", r.Name, r.Spec.NodeName, r.Status.Phase)
		for _, c := range r.Status.Conditions {
			fmt.Fprintf(&b, " %s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	return b.String()
}

func conditionTrue(cs []metav1.Condition, t string) bool {
	for _, c := range cs {
		if c.Type == t {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

// gatewayClient is the official OpenAI client pointed at the gateway.
func gatewayClient() openai.Client {
	return openai.NewClient(option.WithBaseURL(fleet.GatewayURL+"/v1/"), option.WithAPIKey("unused"),
		option.WithMaxRetries(0))
}

// chat sends one greedy completion, streamed or not, and returns its text. An API
// error carries the body the server sent.
func chat(ctx context.Context, c openai.Client, model string, stream bool) (string, error) {
	text, err := chatOnce(ctx, c, model, stream)
	if apiErr := (*openai.Error)(nil); errors.As(err, &apiErr) {
		return "", fmt.Errorf("%w: %s", err, apiErr.RawJSON())
	}
	return text, err
}

func chatOnce(ctx context.Context, c openai.Client, model string, stream bool) (string, error) {
	params := openai.ChatCompletionNewParams{
		Model:       model,
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello, fleet")},
		MaxTokens:   openai.Int(8),
		Temperature: openai.Float(0),
	}
	if !stream {
		resp, err := c.Chat.Completions.New(ctx, params)
		if err != nil {
			return "", err
		}
		if len(resp.Choices) != 1 || resp.Usage.CompletionTokens != 8 {
			return "", fmt.Errorf("completion %+v", resp)
		}
		return resp.Choices[0].Message.Content, nil
	}
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := c.Chat.Completions.NewStreaming(ctx, params)
	acc := openai.ChatCompletionAccumulator{}
	chunks := 0
	for s.Next() {
		acc.AddChunk(s.Current())
		chunks++
	}
	if err := s.Err(); err != nil {
		return "", err
	}
	if len(acc.Choices) != 1 || acc.Usage.CompletionTokens != 8 || chunks < 3 {
		return "", fmt.Errorf("stream of %d chunks accumulated to %+v", chunks, acc.ChatCompletion)
	}
	return acc.Choices[0].Message.Content, nil
}

func TestChatThroughGatewayAndEndpointSlice(t *testing.T) {
	ns := testenv.NewNamespace(t, fleet.Client)
	create(t, deployment(ns, "chat", 2, func(md *v1alpha1.ModelDeployment) {
		md.Spec.Model.Aliases = []string{"chat-alias"}
		md.Spec.Placement.Strategy = v1alpha1.Spread
	}))
	replicas := waitReady(t, ns, "chat", 2, 3*time.Minute)
	if replicas[0].Spec.NodeName == replicas[1].Spec.NodeName {
		t.Errorf("Spread placed both replicas on %s", replicas[0].Spec.NodeName)
	}

	c := gatewayClient()
	want, err := chat(t.Context(), c, "chat", false)
	if err != nil {
		t.Fatalf("non-streamed chat through the gateway: %v", err)
	}
	for _, model := range []string{"chat", "chat-alias", ns + "/chat"} {
		got, err := chat(t.Context(), c, model, true)
		if err != nil {
			t.Fatalf("streamed chat through the gateway as %q: %v", model, err)
		}
		if got != want {
			t.Errorf("greedy streamed answer %q, non-streamed %q", got, want)
		}
	}

	// The per-deployment Service's EndpointSlices list each Mac holding a ready
	// replica; a gateway's client certificate reaches those agents directly.
	addrs := sliceAddresses(t, ns, "chat", 2)
	for _, addr := range addrs {
		direct := openaiDirect(addr)
		got, err := chat(t.Context(), direct, "chat", true)
		if err != nil {
			t.Fatalf("chat straight to the agent at %s: %v", addr, err)
		}
		if got != want {
			t.Errorf("agent %s answered %q, the gateway %q", addr, got, want)
		}
		unauth := openai.NewClient(option.WithBaseURL(localfleet.AgentURL(addr)+"/v1/"), option.WithAPIKey("wrong"),
			option.WithHTTPClient(anonymousClient(t)), option.WithMaxRetries(0))
		_, err = chat(t.Context(), unauth, "chat", false)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
			t.Errorf("agent %s without a certificate, with a wrong key: %v, want 401", addr, err)
		}
	}

	_, err = chat(t.Context(), c, "no-such-model", false)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("unknown model through the gateway: %v, want 404", err)
	}
}

// sliceAddresses waits until the deployment's EndpointSlices hold want ready
// endpoints and returns them as host:port.
func sliceAddresses(t testing.TB, ns, name string, want int) []string {
	t.Helper()
	var addrs []string
	testenv.Eventually(t, time.Minute, 200*time.Millisecond, func() (bool, string) {
		addrs = readySliceAddresses(t, ns, name)
		return len(addrs) == want, fmt.Sprintf("ready endpoints %v, want %d", addrs, want)
	})
	return addrs
}
