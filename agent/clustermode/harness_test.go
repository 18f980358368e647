package clustermode_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/macfleet/macfleet/agent/clustermode"
	"github.com/macfleet/macfleet/agent/janitor"
	"github.com/macfleet/macfleet/agent/server"
	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/ggufsynth"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
	"github.com/macfleet/macfleet/test/support/testenv"
)

var (
	env *testenv.Env
	// tinyModel is a synthesized ggufsynth.Tiny model shared by the package's tests.
	tinyModel string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "macfleet-cluster-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tinyModel = filepath.Join(dir, "tiny.gguf")
	if err := ggufsynth.Write(tinyModel, ggufsynth.Tiny()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	testenv.Main(m, &env, testenv.WithScheme(v1alpha1.AddToScheme))
}

// The agents' certificates come from a CA of the test (the CSR path to the manager's
// signer is tested in controllers/certsigner and end to end in test/e2e).
var (
	testCA    = sync.OnceValues(func() (*pki.CA, error) { return pki.NewCA(time.Now(), time.Hour*24) })
	gatewayID = pki.Gateway("test-gateway")
)

// source is a pki.Source with a certificate of the test CA for id (none for nil).
func source(t *testing.T, id *pki.Identity) *pki.Source {
	t.Helper()
	ca, err := testCA()
	if err != nil {
		t.Fatal(err)
	}
	src, err := ca.NewSource(id, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// nodeCertificate is the serving certificate of node's agent.
func nodeCertificate(t *testing.T, node string) *pki.Source {
	id := pki.Node(node)
	return source(t, &id)
}

// agentClient calls node's agent with the certificate of id (none for nil).
func agentClient(t *testing.T, node string, id *pki.Identity) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = source(t, id).ClientConfig(pki.Node(node))
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// nodeSeq numbers the node names of the test binary's agents.
var nodeSeq atomic.Int64

// runnerPath returns $MACFLEET_RUNNER or skips the test.
func runnerPath(t *testing.T) string {
	t.Helper()
	p := os.Getenv(runnerproc.RunnerEnv)
	if p == "" {
		t.Skip("MACFLEET_RUNNER is not set: build the runner with `make runner` and export MACFLEET_RUNNER=$PWD/bin/macfleet-runner")
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("MACFLEET_RUNNER=%s: %v", p, err)
	}
	return p
}

// loopbackPolicy lets every namespace fetch over plain HTTP from the tests' loopback
// servers (the default policy denies loopback addresses).
func loopbackPolicy(t *testing.T) *sourcepolicy.Holder {
	t.Helper()
	p, err := sourcepolicy.Compile(&v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SourcePolicyName},
		Spec: v1alpha1.SourcePolicySpec{
			Rules:           []v1alpha1.SourcePolicyRule{{Namespaces: []string{"*"}, Hosts: []string{"127.0.0.1"}, AllowPlainHTTP: true}},
			AllowedNetworks: []string{"127.0.0.0/8"},
		}})
	if err != nil {
		t.Fatal(err)
	}
	return sourcepolicy.NewHolder(p)
}

// fileStore serves file:// sources in place, verifying the sha256 when one is given.
type fileStore struct{}

type checksumError struct{ got, want string }

func (e *checksumError) Error() string {
	return fmt.Sprintf("sha256 of the file is %s, want %s", e.got, e.want)
}
func (e *checksumError) ChecksumMismatch() bool { return true }

func (fileStore) Fetch(ctx context.Context, _, source, sum string, progress func(done, total int64)) (string, error) {
	u, err := url.Parse(source)
	if err != nil || u.Scheme != "file" {
		return "", fmt.Errorf("the test store only fetches file:// sources, not %q", source)
	}
	b, err := os.ReadFile(u.Path)
	if err != nil {
		return "", err
	}
	if sum != "" {
		h := sha256.Sum256(b)
		if got := hex.EncodeToString(h[:]); got != sum {
			return "", &checksumError{got: got, want: sum}
		}
	}
	progress(int64(len(b)), int64(len(b)))
	return u.Path, nil
}

// testAgent is one `macfleet agent` run in-process against the test API server.
type testAgent struct {
	t        *testing.T
	node     string
	url      string
	endpoint string
	logs     *logBuffer
	// gateway calls the agent with a gateway's certificate, anon with none.
	gateway, anon *http.Client
	// stop stops the agent and waits for it (idempotent).
	stop func()
}

type agentOptions struct {
	node string
	// rest overrides the API server's config (e.g. through a proxy).
	rest  *rest.Config
	store clustermode.Store
	// stateDir makes runners outlive the agent for the next one to adopt.
	stateDir string
	// promptCacheDir gives the runners an SSD tier there (10Gi each).
	promptCacheDir string
	janitor        janitor.Options
	// sourcePolicy is kept at the cluster's SourcePolicy by the agent.
	sourcePolicy *sourcepolicy.Holder
}

type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) line(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintln(&l.b, prefix, args)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startAgent(t *testing.T, o agentOptions) *testAgent {
	t.Helper()
	rp := runnerPath(t)
	if o.node == "" {
		// Unique per run: envtest never deletes namespaces, so replicas of an earlier
		// run (-count) are still bound to the node names it used.
		o.node = fmt.Sprintf("mac-%s-%d", strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())),
			nodeSeq.Add(1))
	}
	if o.rest == nil {
		o.rest = env.Config
	}
	if o.store == nil {
		o.store = fileStore{}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	log := funcr.New(logs.line, funcr.Options{Verbosity: 2})
	a := &testAgent{t: t, node: o.node, url: "https://" + ln.Addr().String(), endpoint: ln.Addr().String(), logs: logs,
		gateway: agentClient(t, o.node, &gatewayID), anon: agentClient(t, o.node, nil)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg := clustermode.Config{
		RestConfig: o.rest, NodeName: o.node, Listener: ln, AdvertiseAddress: a.endpoint, Certificates: nodeCertificate(t, o.node),
		Store: o.store, RunnerPath: rp, RunnerThreads: 1, SocketDir: t.TempDir(), StateDir: o.stateDir,
		KeepRunners: o.stateDir != "", PromptCacheDir: o.promptCacheDir, PromptCacheSSDBytes: 10 << 30,
		Pool: enginepool.Config{CeilingBytes: 4 << 30, DrainTimeout: 10 * time.Second, BackoffInitial: 100 * time.Millisecond,
			StopGrace: 3 * time.Second, PollActive: 200 * time.Millisecond, SettleTimeout: time.Second},
		Syncer:          clustermode.SyncerOptions{ResyncPeriod: 2 * time.Second, FetchBackoffInitial: 200 * time.Millisecond},
		Janitor:         o.janitor,
		SourcePolicy:    o.sourcePolicy,
		ShutdownTimeout: time.Minute,
		Log:             log,
	}
	go func() { done <- clustermode.Run(ctx, cfg) }()
	var once sync.Once
	a.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("the agent stopped with: %v", err)
				}
			case <-time.After(2 * time.Minute):
				t.Errorf("the agent did not stop within 2m")
			}
		})
	}
	t.Cleanup(func() {
		a.stop()
		if t.Failed() {
			t.Logf("agent %s log:\n%s", a.node, logs.String())
		}
	})
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		resp, err := a.anon.Get(a.url + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("/readyz answered %d", resp.StatusCode)
	})
	return a
}

// do sends a request to the agent with optional header pairs and returns the
// response with its body read: with the pair auth, as a gateway (its client
// certificate), else with no client certificate.
func (a *testAgent) do(method, path string, body any, header ...string) (*http.Response, []byte) {
	a.t.Helper()
	c := a.anon
	var rest []string
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == auth[0] {
			c = a.gateway
			continue
		}
		rest = append(rest, header[i], header[i+1])
	}
	return testenv.DoWith(a.t, c, method, a.url+path, body, rest...)
}

// auth, among a request's header pairs, sends it as a gateway (see do).
var auth = []string{"X-Test-Caller", "gateway"}

// chat sends a short chat completion for model (with extra header pairs) and returns
// the status and body.
func (a *testAgent) chat(model string, header ...string) (int, string) {
	a.t.Helper()
	body := map[string]any{"model": model, "max_tokens": 4, "temperature": 0,
		"messages": []map[string]string{{"role": "user", "content": "hello"}}}
	resp, b := a.do(http.MethodPost, "/v1/chat/completions", body, header...)
	return resp.StatusCode, string(b)
}

func (a *testAgent) status() server.StatusResponse {
	a.t.Helper()
	resp, b := a.do(http.MethodGet, "/api/status", nil, auth...)
	if resp.StatusCode != http.StatusOK {
		a.t.Fatalf("GET /api/status: %d %s", resp.StatusCode, b)
	}
	var s server.StatusResponse
	if err := json.Unmarshal(b, &s); err != nil {
		a.t.Fatalf("decoding /api/status: %v\n%s", err, b)
	}
	return s
}

// model is the pool entry named name, if any.
func (a *testAgent) model(name string) (enginepool.ModelSnapshot, bool) {
	for _, m := range a.status().Models {
		if m.Name == name {
			return m, true
		}
	}
	return enginepool.ModelSnapshot{}, false
}

type replicaOpts struct {
	deployment, servedName string
	residency              v1alpha1.Residency
	hash                   string
	idle                   time.Duration
	source                 string
	sha                    string
	ctxLen                 int32
	reservation            string
	promptCache            *v1alpha1.PromptCacheSpec
}

// newReplica creates a ModelReplica bound to node, as the deployment controller and
// the scheduler would.
func newReplica(t *testing.T, ns, name, node string, o replicaOpts) *v1alpha1.ModelReplica {
	t.Helper()
	if o.deployment == "" {
		o.deployment = "tiny"
	}
	if o.hash == "" {
		o.hash = "h1"
	}
	if o.source == "" {
		o.source = "file://" + tinyModel
	}
	if o.residency == "" {
		o.residency = v1alpha1.ResidencyResident
	}
	if o.ctxLen == 0 {
		o.ctxLen = 512
	}
	if o.reservation == "" {
		o.reservation = "512Mi"
	}
	mr := &v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{v1alpha1.LabelDeployment: o.deployment, v1alpha1.LabelTemplateHash: o.hash}},
		Spec: v1alpha1.ModelReplicaSpec{
			Template: v1alpha1.ModelReplicaTemplate{
				Model: v1alpha1.ModelSource{Source: o.source, SHA256: o.sha, ServedName: o.servedName},
				Engine: v1alpha1.EngineSpec{Settings: engine.Settings{ContextLength: o.ctxLen, Parallel: 1, KVCacheType: v1alpha1.KVCacheF16},
					PromptCache: o.promptCache},
				Residency: o.residency,
			},
			TemplateHash:      o.hash,
			MemoryReservation: resource.MustParse(o.reservation),
			NodeName:          node,
		},
	}
	if o.idle > 0 {
		mr.Spec.Template.IdleTimeout = &metav1.Duration{Duration: o.idle}
	}
	if err := env.Client.Create(t.Context(), mr); err != nil {
		t.Fatalf("creating replica %s: %v", name, err)
	}
	return mr
}

func getReplica(t *testing.T, ns, name string) *v1alpha1.ModelReplica {
	t.Helper()
	var mr v1alpha1.ModelReplica
	if err := env.Client.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, &mr); err != nil {
		t.Fatalf("reading replica %s: %v", name, err)
	}
	return &mr
}

// waitReplica polls the replica until cond accepts it.
func waitReplica(t *testing.T, timeout time.Duration, ns, name string, cond func(*v1alpha1.ModelReplica) (bool, string)) *v1alpha1.ModelReplica {
	t.Helper()
	var last *v1alpha1.ModelReplica
	testenv.Eventually(t, timeout, 100*time.Millisecond, func() (bool, string) {
		last = getReplica(t, ns, name)
		ok, msg := cond(last)
		return ok, fmt.Sprintf("replica %s: %s (status %s)", name, msg, statusJSON(last))
	})
	return last
}

func statusJSON(mr *v1alpha1.ModelReplica) string {
	b, _ := json.Marshal(mr.Status)
	return string(b)
}

// condIs checks a condition's status and reason.
func condIs(mr *v1alpha1.ModelReplica, typ string, status metav1.ConditionStatus, reason string) (bool, string) {
	c := meta.FindStatusCondition(mr.Status.Conditions, typ)
	if c == nil {
		return false, typ + " not set"
	}
	if c.Status != status || c.Reason != reason {
		return false, fmt.Sprintf("%s is %s/%s (%s), want %s/%s", typ, c.Status, c.Reason, c.Message, status, reason)
	}
	return true, ""
}

func allOf(checks ...func() (bool, string)) (bool, string) {
	for _, c := range checks {
		if ok, msg := c(); !ok {
			return false, msg
		}
	}
	return true, ""
}

// throughProxy is env.Config through a relay that can cut it off the API server.
func throughProxy(t *testing.T) (*rest.Config, *testenv.Relay) {
	rc, r := testenv.RelayConfig(t, env.Config)
	rc.Timeout = 5 * time.Second
	return rc, r
}
