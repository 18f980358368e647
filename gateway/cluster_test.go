package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/agent/standalone"
	"github.com/macfleet/macfleet/api/engine"
	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/apikeyindex/apikeyindextest"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// The envtest API server is started by the first test that needs it, so the unit
// tests of the package run without the envtest binaries.
var (
	envOnce      sync.Once
	env          *testenv.Env
	envErr       error
	stopKeyIndex func() error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if stopKeyIndex != nil {
		if err := stopKeyIndex(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	if env != nil {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
	}
	os.Exit(code)
}

func cluster(t *testing.T) *testenv.Env {
	t.Helper()
	envOnce.Do(func() {
		// The manager's key index publisher, which the gateway with --tenant-keys reads.
		if env, envErr = testenv.New(testenv.WithScheme(mfv1.AddToScheme)); envErr == nil {
			stopKeyIndex, envErr = apikeyindextest.Start(env, 0)
		}
	})
	if envErr != nil {
		t.Fatal(envErr)
	}
	return env
}

const fleetToken = "fleet-token-for-tests"

// loopback is a listener on a port of its own for the gateway to serve: the port is
// never free between choosing it and serving it.
func loopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

type runningGateway struct {
	url, probes, metrics string
	// key is the client API key the test's own calls send, if the gateway wants one.
	key string
	// stop ends the gateway and waits for Run to return (the test's end does too).
	stop func()
}

// startGateway runs gateway.Run against the envtest API server until the test ends,
// and waits for /readyz.
func startGateway(t *testing.T, e *testenv.Env, cfg gateway.Config) runningGateway {
	t.Helper()
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte(fleetToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln := loopback(t)
	if cfg.RestConfig == nil {
		cfg.RestConfig = e.Config
	}
	cfg.Listener = ln
	cfg.FleetTokenFile = tok
	cfg.ProbeListener = loopback(t)
	ctx, cancel := context.WithCancel(ctrl.LoggerInto(context.Background(), testr.New(t)))
	done := make(chan error, 1)
	go func() { done <- gateway.Run(ctx, cfg) }()
	stop := sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("gateway.Run: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("gateway.Run did not return")
		}
	})
	t.Cleanup(stop)
	g := runningGateway{url: "http://" + ln.Addr().String(), probes: "http://" + cfg.ProbeListener.Addr().String(), stop: stop}
	if cfg.MetricsListener != nil {
		g.metrics = "http://" + cfg.MetricsListener.Addr().String()
	}
	testenv.Eventually(t, time.Minute, 50*time.Millisecond, func() (bool, string) {
		select {
		case err := <-done:
			t.Fatalf("gateway.Run returned: %v", err)
		default:
		}
		code, body := get(g.probes + "/readyz")
		return code == http.StatusOK, fmt.Sprintf("/readyz: %d %s", code, body)
	})
	return g
}

func get(url string, key ...string) (int, string) {
	return send(http.MethodGet, url, "", key...)
}

// send sends body ("" for none) to url with the key, if any, and returns the status
// and body (status 0 and the error when the request failed).
func send(method, url, body string, key ...string) (int, string) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, err.Error()
	}
	if len(key) > 0 && key[0] != "" {
		req.Header.Set("Authorization", "Bearer "+key[0])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// chatVia posts a chat completion for model to the gateway and returns the status and
// body (status 0 and the error when the request failed).
func chatVia(g runningGateway, model string) (int, string) {
	resp, err := http.Post(g.url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// fleet writes the objects the gateway reads, as the controllers and agents would.
type fleet struct {
	t  *testing.T
	c  client.Client
	ns string
}

func (f *fleet) node(name string, ready metav1.ConditionStatus) {
	f.t.Helper()
	n := &mfv1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := f.c.Create(f.t.Context(), n); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = f.c.Delete(context.Background(), n) })
	f.setNode(name, ready)
}

func (f *fleet) setNode(name string, ready metav1.ConditionStatus) {
	f.t.Helper()
	n := &mfv1.MacNode{}
	if err := f.c.Get(f.t.Context(), client.ObjectKey{Name: name}, n); err != nil {
		f.t.Fatal(err)
	}
	meta.SetStatusCondition(&n.Status.Conditions, metav1.Condition{Type: mfv1.MacNodeReady, Status: ready,
		Reason: mfv1.ReasonAgentReady, Message: "test"})
	if err := f.c.Status().Update(f.t.Context(), n); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fleet) deployment(name, served string, replicas int32) {
	f.t.Helper()
	d := &mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: mfv1.ModelDeploymentSpec{Model: mfv1.ModelSource{Source: "https://models.example/tiny.gguf", ServedName: served},
			Replicas: ptr.To(replicas)}}
	if err := f.c.Create(f.t.Context(), d); err != nil {
		f.t.Fatal(err)
	}
	f.cleanup(d)
}

// cleanup deletes obj when the test ends: envtest deletes no namespace's contents, and
// the next test's gateway must not see this one's deployments.
func (f *fleet) cleanup(obj client.Object) {
	f.t.Cleanup(func() {
		if err := f.c.Delete(context.Background(), obj); err != nil && !apierrors.IsNotFound(err) {
			f.t.Errorf("deleting %s: %v", obj.GetName(), err)
		}
	})
}

func (f *fleet) replica(name, deployment, nodeName string) {
	f.t.Helper()
	r := &mfv1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: map[string]string{mfv1.LabelDeployment: deployment}},
		Spec: mfv1.ModelReplicaSpec{
			Template:          mfv1.ModelReplicaTemplate{Model: mfv1.ModelSource{Source: "https://models.example/tiny.gguf"}},
			TemplateHash:      "h1",
			MemoryReservation: resource.MustParse("1Gi"),
			NodeName:          nodeName,
		},
	}
	if err := f.c.Create(f.t.Context(), r); err != nil {
		f.t.Fatal(err)
	}
	f.cleanup(r)
}

// setReplica writes what the agent of the replica's node would: Ready and endpoint.
func (f *fleet) setReplica(name string, ready metav1.ConditionStatus, endpoint string) {
	f.t.Helper()
	r := &mfv1.ModelReplica{}
	if err := f.c.Get(f.t.Context(), client.ObjectKey{Namespace: f.ns, Name: name}, r); err != nil {
		f.t.Fatal(err)
	}
	r.Status.Endpoint = endpoint
	meta.SetStatusCondition(&r.Status.Conditions, metav1.Condition{Type: mfv1.ReplicaReady, Status: ready,
		Reason: mfv1.ReasonRunnerReady, Message: "test"})
	if err := f.c.Status().Update(f.t.Context(), r); err != nil {
		f.t.Fatal(err)
	}
}

// tinyFleet writes, in a new namespace, a Ready Mac and the deployment "tiny" with
// one Ready replica on it that agent serves.
func tinyFleet(t *testing.T, e *testenv.Env, agent string) *fleet {
	t.Helper()
	f := &fleet{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}
	mac := "mac-" + f.ns
	f.node(mac, metav1.ConditionTrue)
	f.deployment("tiny", "", 1)
	f.replica("tiny-0", "tiny", mac)
	f.setReplica("tiny-0", metav1.ConditionTrue, agent)
	return f
}

type listedModel struct {
	ID            string `json:"id"`
	Namespace     string `json:"namespace"`
	ReadyReplicas int    `json:"ready_replicas"`
}

// waitModel waits until GET /v1/models lists id in ns with n routable replicas.
func waitModel(t *testing.T, g runningGateway, id, ns string, n int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		ready, body := readyReplicas(g, id, ns)
		return ready == n, fmt.Sprintf("waiting for %s in %s with %d ready replicas: %s", id, ns, n, body)
	})
}

// readyReplicas is how many routable replicas GET /v1/models lists for id in ns (-1
// when it lists none), and what it answered.
func readyReplicas(g runningGateway, id, ns string) (int, string) {
	code, body := get(g.url+"/v1/models", g.key)
	var l struct{ Data []listedModel }
	_ = json.Unmarshal([]byte(body), &l)
	for _, m := range l.Data {
		if m.ID == id && m.Namespace == ns {
			return m.ReadyReplicas, body
		}
	}
	return -1, fmt.Sprintf("%d %s", code, body)
}

// startAgent runs a real standalone agent serving the synthesized model "tiny" with
// the fleet token, until the test ends; it returns the agent's host:port once ready.
func startAgent(t *testing.T, runner string) string {
	t.Helper()
	return startAgentOf(t, runner, ggufsynth.Tiny())
}

// startAgentOf is startAgent with the model synthesized from spec.
func startAgentOf(t *testing.T, runner string, spec ggufsynth.Spec) string {
	t.Helper()
	return startAgentWith(t, runner, spec, engine.Settings{ContextLength: 1024})
}

// startAgentWith is startAgentOf with the model's engine settings.
func startAgentWith(t *testing.T, runner string, spec ggufsynth.Spec, settings engine.Settings) string {
	t.Helper()
	model := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := ggufsynth.Write(model, spec); err != nil {
		t.Fatal(err)
	}
	acfg, err := config.Config{Runner: runner, RunnerThreads: 1, MemoryCeiling: 2 << 30, Listen: "127.0.0.1:0",
		APIKey: fleetToken,
		Models: []config.Model{{Name: "tiny", Path: model, Settings: settings, Residency: config.ResidencyResident}},
	}.Complete()
	if err != nil {
		t.Fatal(err)
	}
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(context.Background())
	adone := make(chan error, 1)
	go func() {
		adone <- standalone.Run(actx, acfg, standalone.Options{Log: testr.New(t), Listener: aln,
			Pool: enginepool.Config{DrainTimeout: time.Second, SettleTimeout: time.Second}})
	}()
	t.Cleanup(func() {
		acancel()
		select {
		case <-adone:
		case <-time.After(2 * time.Minute):
			t.Error("the agent did not stop")
		}
	})
	agent := aln.Addr().String()
	testenv.Eventually(t, 2*time.Minute, 50*time.Millisecond, func() (bool, string) {
		code, body := get("http://" + agent + "/readyz")
		return code == http.StatusOK, fmt.Sprintf("agent /readyz: %d %s", code, body)
	})
	return agent
}

// realAgent is the API server, a real agent (startAgent) and a gateway keys file
// holding key, for the tests that go through a runner; it skips the test without
// MACFLEET_RUNNER.
func realAgent(t *testing.T, key string) (e *testenv.Env, agent, keysFile string) {
	t.Helper()
	return realAgentWith(t, key, engine.Settings{ContextLength: 1024})
}

// realAgentWith is realAgent with the model's engine settings.
func realAgentWith(t *testing.T, key string, settings engine.Settings) (e *testenv.Env, agent, keysFile string) {
	t.Helper()
	runner := os.Getenv(runnerproc.RunnerEnv)
	if runner == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	e = cluster(t)
	agent = startAgentWith(t, runner, ggufsynth.Tiny(), settings)
	keysFile = filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keysFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return e, agent, keysFile
}

// TestThroughRealAgent: a chat completion, streamed and not, from the official OpenAI
// client through the gateway to a real agent (engine pool, runner process,
// synthesized model) that the gateway found through the API server. The agent
// requires the fleet token; the gateway requires a client key.
func TestThroughRealAgent(t *testing.T) {
	e, agent, keys := realAgent(t, "client-key")
	// The default registry: the metrics server must serve the gateway's series.
	g := startGateway(t, e, gateway.Config{APIKeysFile: keys, MetricsListener: loopback(t), ColdStartTimeout: 30 * time.Second})

	f := tinyFleet(t, e, agent)
	g.key = "client-key"
	waitModel(t, g, "tiny", f.ns, 1)

	oc := openai.NewClient(option.WithBaseURL(g.url+"/v1/"), option.WithAPIKey("client-key"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const maxTokens = 6
	params := openai.ChatCompletionNewParams{
		Model:       "tiny",
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello there")},
		MaxTokens:   openai.Int(maxTokens),
		Temperature: openai.Float(0),
	}
	t.Run("chat", func(t *testing.T) {
		resp, err := oc.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" || resp.Usage.CompletionTokens != maxTokens {
			t.Errorf("response %+v", resp)
		}
	})
	t.Run("chat-stream", func(t *testing.T) {
		p := params
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := oc.Chat.Completions.NewStreaming(ctx, p)
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			acc.AddChunk(stream.Current())
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if chunks < 3 || len(acc.Choices) != 1 || acc.Choices[0].Message.Content == "" || acc.Usage.CompletionTokens != maxTokens {
			t.Errorf("%d chunks, accumulated %+v", chunks, acc.ChatCompletion)
		}
	})
	t.Run("models", func(t *testing.T) {
		page, err := oc.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, m := range page.Data {
			found = found || (m.ID == "tiny" && m.OwnedBy == f.ns)
		}
		if !found {
			t.Errorf("models %+v lack tiny owned by %s", page.Data, f.ns)
		}
	})
	t.Run("bad key", func(t *testing.T) {
		bad := openai.NewClient(option.WithBaseURL(g.url+"/v1/"), option.WithAPIKey("wrong"), option.WithMaxRetries(0))
		_, err := bad.Chat.Completions.New(ctx, params)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
			t.Errorf("err %v, want a 401", err)
		}
	})
	t.Run("metrics", func(t *testing.T) {
		// Requests are counted after their last byte: poll.
		testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
			code, body := get(g.metrics + "/metrics")
			for _, want := range []string{
				fmt.Sprintf(`macfleet_gateway_requests_total{code="200",endpoint="chat_completions",model="%s/tiny"} 2`, f.ns),
				fmt.Sprintf(`macfleet_gateway_ttft_seconds_count{endpoint="chat_completions",model="%s/tiny"} 2`, f.ns),
				`macfleet_gateway_errors_total{model="",reason="unauthorized"} `,
			} {
				if !strings.Contains(body, want) {
					var ours []string
					for l := range strings.Lines(body) {
						if strings.HasPrefix(l, "macfleet_gateway_") {
							ours = append(ours, l)
						}
					}
					return false, fmt.Sprintf("/metrics (%d) lacks %s; it has:\n%s", code, want, strings.Join(ours, ""))
				}
			}
			return true, ""
		})
	})
}

// gaugeValue reads a gauge of the registry by its model label (0 when absent).
func gaugeValue(t *testing.T, reg *prometheus.Registry, name, model string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "model" && l.GetValue() == model {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// TestTableFollowsCluster: the table follows the objects in the API server — a replica
// on a NotReady Mac is not routed to, a request held for a cold start is served as
// soon as a replica becomes routable, and a bare name served in two namespaces must
// be qualified.
func TestTableFollowsCluster(t *testing.T) {
	e := cluster(t)
	var mu sync.Mutex
	var seen []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+fleetToken {
			http.Error(w, `{"error":{"message":"no fleet token"}}`, http.StatusUnauthorized)
			return
		}
		mu.Lock()
		seen = append(seen, r.Header.Get(mfv1.HeaderReplica))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"replica":%q}`, r.Header.Get(mfv1.HeaderReplica))
	}))
	defer up.Close()
	endpoint := strings.TrimPrefix(up.URL, "http://")
	reg := prometheus.NewRegistry()
	g := startGateway(t, e, gateway.Config{ColdStartTimeout: 20 * time.Second, Registerer: reg})

	f := &fleet{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}
	good, bad := "good-"+f.ns, "bad-"+f.ns
	f.node(good, metav1.ConditionTrue)
	f.node(bad, metav1.ConditionFalse)
	served := f.ns + "-served"
	f.deployment("m", served, 2)
	f.replica("m-good", "m", good)
	f.replica("m-bad", "m", bad)
	f.setReplica("m-good", metav1.ConditionTrue, endpoint)
	f.setReplica("m-bad", metav1.ConditionTrue, endpoint)
	waitModel(t, g, served, f.ns, 1)

	chat := func(model string) (int, string) { return chatVia(g, model) }
	for range 4 {
		if code, body := chat(served); code != 200 || body != fmt.Sprintf(`{"replica":"%s/m-good"}`, f.ns) {
			t.Fatalf("%d %s", code, body)
		}
	}

	// The good Mac's lease expires: nothing is routable; a request waits, and is
	// served once the bad Mac turns Ready.
	f.setNode(good, metav1.ConditionUnknown)
	waitModel(t, g, served, f.ns, 0)
	type result struct {
		code int
		body string
	}
	done := make(chan result, 1)
	go func() {
		code, body := chat(f.ns + "/" + served)
		done <- result{code, body}
	}()
	// The request is held (in flight, not answered) while nothing is routable.
	testenv.Eventually(t, 10*time.Second, 10*time.Millisecond, func() (bool, string) {
		n := gaugeValue(t, reg, "macfleet_gateway_inflight", f.ns+"/m")
		return n == 1, fmt.Sprintf("%v requests in flight", n)
	})
	select {
	case r := <-done:
		t.Fatalf("answered %d %s with no routable replica", r.code, r.body)
	default:
	}
	f.setNode(bad, metav1.ConditionTrue)
	select {
	case r := <-done:
		if r.code != 200 || r.body != fmt.Sprintf(`{"replica":"%s/m-bad"}`, f.ns) {
			t.Errorf("held request: %d %s", r.code, r.body)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the held request was not served after a Mac turned Ready")
	}

	// The same served name in a second namespace: the bare name is ambiguous.
	f2 := &fleet{t: t, c: e.Client, ns: testenv.NewNamespace(t, e.Client)}
	f2.deployment("other", served, 1)
	testenv.Eventually(t, 30*time.Second, 20*time.Millisecond, func() (bool, string) {
		code, body := chat(served)
		return code == 400 && strings.Contains(body, f.ns) && strings.Contains(body, f2.ns), fmt.Sprintf("%d %s", code, body)
	})
	if code, body := chat(f.ns + "/" + served); code != 200 {
		t.Errorf("qualified name: %d %s", code, body)
	}
}
