// Package localfleet starts a whole macfleet on one machine from the real binaries: a
// kube-apiserver and etcd (the envtest binaries), `macfleet manager`, `macfleet
// gateway`, one `macfleet agent` per simulated Mac (each with its own node credential
// and memory ceiling) and an HTTP server holding model files. `make demo` runs it
// through hack/localfleet and the end-to-end tests in test/e2e drive it directly.
//
// The fleet's components reach the API server through a TCP relay (Fleet.CutAPIServer
// and RestoreAPIServer make the API server unreachable and reachable again), and each
// agent listens on the host's first non-loopback IPv4 address: the API server refuses
// loopback addresses in EndpointSlices.
package localfleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/pki"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
	"github.com/macfleet/macfleet/test/support/hubdouble"
	"github.com/macfleet/macfleet/test/support/tcprelay"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// Node is one simulated Mac.
type Node struct {
	// Name is the MacNode's name.
	Name string
	// MemoryCeiling is the agent's --memory-ceiling, e.g. "2Gi".
	MemoryCeiling string
	// Chip and UnifiedMemory are what the agent reports as its hardware.
	Chip          string
	UnifiedMemory string
}

// Options configure a fleet.
type Options struct {
	// Binary is the macfleet executable (bin/macfleet).
	Binary string
	// Runner is the runner executable (bin/macfleet-runner).
	Runner string
	// Dir holds the fleet's kubeconfigs, logs, model store, state and models.
	Dir string
	// Nodes are the simulated Macs; two different ones when empty.
	Nodes []Node
	// NodeLossGrace is the manager's --node-loss-grace; 0 leaves its default.
	NodeLossGrace time.Duration
	// LeaseDuration is each agent's --lease-duration; 0 leaves its default.
	LeaseDuration time.Duration
	// ModelsAddr is where the model server listens; 127.0.0.1 on a free port when empty.
	ModelsAddr string
	// AgentArgs are extra arguments for every agent.
	AgentArgs []string
	// ManagerArgs are extra arguments for the manager.
	ManagerArgs []string
	// GatewayArgs are extra arguments for every gateway replica.
	GatewayArgs []string
	// Gateways is how many gateway replicas run (each its own process and port); 1
	// when 0.
	Gateways int
	// ReplicaReadsByRBAC runs the weaker mode: no node authorizer; every node identity
	// may read every ModelReplica (config/agent-replica-reads).
	ReplicaReadsByRBAC bool
	// Hub runs a model hub double (Fleet.Hub) that hf:// sources resolve against.
	Hub bool
	// Log receives one line per step; nil discards them.
	Log io.Writer
}

// DefaultNodes are two Macs with different memory ceilings.
var DefaultNodes = []Node{
	{Name: "mac-studio-1", MemoryCeiling: "3Gi", Chip: "Apple M2 Ultra (simulated)", UnifiedMemory: "64Gi"},
	{Name: "mac-mini-1", MemoryCeiling: "1536Mi", Chip: "Apple M4 (simulated)", UnifiedMemory: "16Gi"},
}

// Fleet is a running local fleet.
type Fleet struct {
	opts Options
	// Env is the API server; Env.Client is an admin client straight to it.
	Env *testenv.Env
	// Client is an admin client.
	Client client.Client
	// AdminKubeconfig is a kubeconfig file for an admin, through the relay.
	AdminKubeconfig string
	// GatewayURL is the first gateway's base URL (http://127.0.0.1:port).
	GatewayURL string
	// GatewayURLs are the base URLs of every gateway replica, GatewayURL first.
	GatewayURLs []string
	// ModelsURL is the base URL of the model server; files in ModelsDir are under it.
	ModelsURL string
	ModelsDir string
	// Hub is the model hub double (Options.Hub; nil without): hf://org/repo/path is
	// the file HubDir/org/repo/path, and a test gates a repository with Hub.Gate.
	Hub    *hubdouble.Hub
	HubDir string
	// AgentHTTP calls the agents (https://, AgentURL) with a client certificate of the
	// gateway identity "e2e" from the fleet CA: the whole API, as a gateway.
	AgentHTTP *http.Client
	// HostIP is the address the agents listen on.
	HostIP string
	// NodeAuthorizer is the node authorizer the API server asks; zero with
	// Options.ReplicaReadsByRBAC.
	NodeAuthorizer NodeAuthorizer

	relay  *tcprelay.Relay
	models *http.Server

	// mu guards the processes and agents, which restarts replace.
	mu       sync.Mutex
	manager  *component
	gateways []*component
	agents   map[string]*Agent
}

// Agent is one simulated Mac's agent.
type Agent struct {
	Node Node
	// Addr is host:port of its HTTP API.
	Addr       string
	Kubeconfig string
	StateDir   string
	proc       *Process
}

// Start brings up a fleet and waits until every Mac is Ready and the gateway serves.
// The context bounds the start only; Stop ends the fleet.
func Start(ctx context.Context, opts Options) (_ *Fleet, err error) {
	if opts, err = opts.complete(); err != nil {
		return nil, err
	}
	f := &Fleet{opts: opts, agents: map[string]*Agent{}, ModelsDir: filepath.Join(opts.Dir, "models")}
	defer func() {
		if err != nil {
			f.Stop()
		}
	}()
	for _, d := range []string{opts.Dir, f.ModelsDir, filepath.Join(opts.Dir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if f.HostIP, err = HostIP(); err != nil {
		return nil, err
	}
	authzAddr, err := f.startAPIServer(ctx)
	if err != nil {
		return nil, err
	}
	if err := f.serveModels(); err != nil {
		return nil, err
	}
	if err := f.startHub(); err != nil {
		return nil, err
	}
	if err := f.allowLocalSources(ctx); err != nil {
		return nil, err
	}
	if err := f.startManager(ctx, authzAddr); err != nil {
		return nil, err
	}
	for _, n := range opts.Nodes {
		if err := f.addAgent(ctx, n); err != nil {
			return nil, err
		}
	}
	if err := f.startGateways(ctx); err != nil {
		return nil, err
	}
	for _, n := range opts.Nodes {
		if err := f.WaitNodeReady(ctx, n.Name); err != nil {
			return nil, err
		}
	}
	f.logf("Fleet up: %d Macs, gateway %s, console %s/ui/", len(opts.Nodes), strings.Join(f.GatewayURLs, " "), f.GatewayURL)
	return f, nil
}

// complete fills the defaults of opts, makes its paths absolute and checks that the
// binaries exist.
func (opts Options) complete() (Options, error) {
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if len(opts.Nodes) == 0 {
		opts.Nodes = DefaultNodes
	}
	for _, p := range []*string{&opts.Binary, &opts.Runner, &opts.Dir} {
		var err error
		if *p, err = filepath.Abs(*p); err != nil {
			return opts, err
		}
	}
	for _, bin := range []string{opts.Binary, opts.Runner} {
		if st, err := os.Stat(bin); err != nil || st.IsDir() {
			return opts, fmt.Errorf("localfleet: %s is missing: run `make build runner`", bin)
		}
	}
	return opts, nil
}

// startAPIServer starts kube-apiserver and etcd, the relay in front of them, writes the
// admin kubeconfig and installs the manifests. It returns the address the manager's
// node authorizer is to serve on ("" when replica reads go by RBAC).
func (f *Fleet) startAPIServer(ctx context.Context) (authzAddr string, err error) {
	// The manager serves the node authorizer, which the API server asks from its start.
	envOpts := []testenv.Option{testenv.WithScheme(v1alpha1.AddToScheme)}
	if !f.opts.ReplicaReadsByRBAC {
		port, err := freePort()
		if err != nil {
			return "", err
		}
		authzAddr = "127.0.0.1:" + strconv.Itoa(port)
		if f.NodeAuthorizer, err = WriteNodeAuthorizer(f.opts.Dir, authzAddr); err != nil {
			return "", err
		}
		envOpts = append(envOpts, testenv.WithAuthorizationConfig(f.NodeAuthorizer.AuthorizationConfig))
	}
	f.logf("Starting kube-apiserver and etcd")
	if f.Env, err = testenv.New(envOpts...); err != nil {
		return "", err
	}
	f.Client = f.Env.Client
	u, err := url.Parse(f.Env.Config.Host)
	if err != nil {
		return "", fmt.Errorf("the API server's address %q: %w", f.Env.Config.Host, err)
	}
	if f.relay, err = tcprelay.New(u.Host); err != nil {
		return "", err
	}
	if f.AdminKubeconfig, err = f.writeKubeconfig(f.Env.KubeConfig, "admin.kubeconfig"); err != nil {
		return "", err
	}
	if err := f.installManifests(ctx, f.opts.ReplicaReadsByRBAC); err != nil {
		return "", err
	}
	return authzAddr, nil
}

// startManager starts the manager process and builds f.AgentHTTP, the client that calls
// the agents as the gateway identity.
// No shared secret: the manager keeps the fleet CA, signs each agent's certificate
// request and issues the gateway's client certificate, as in a cluster.
func (f *Fleet) startManager(ctx context.Context, authzAddr string) (err error) {
	f.logf("Starting the manager")
	probe, err := freePort()
	if err != nil {
		return err
	}
	margs := []string{"manager", "--kubeconfig", f.AdminKubeconfig, "--metrics-bind-address", "0",
		"--health-probe-bind-address", "127.0.0.1:" + strconv.Itoa(probe)}
	if f.opts.NodeLossGrace > 0 {
		margs = append(margs, "--node-loss-grace", f.opts.NodeLossGrace.String())
	}
	margs = append(append(margs, f.hubArgs()...), f.opts.ManagerArgs...)
	if authzAddr != "" {
		margs = append(margs, "--node-authorizer-bind-address", authzAddr, "--node-authorizer-cert-dir", f.NodeAuthorizer.CertDir,
			"--node-authorizer-client-ca", f.NodeAuthorizer.ClientCA)
	}
	f.manager = &component{name: "manager", args: margs, readyz: fmt.Sprintf("http://127.0.0.1:%d/readyz", probe)}
	if err := f.startComponent(ctx, f.manager); err != nil {
		return err
	}
	f.AgentHTTP, err = f.AgentClient(ctx, &pki.Identity{Kind: pki.KindGateway, Name: "e2e"})
	return err
}

// startGateways starts opts.Gateways gateway processes (at least one) and records
// their URLs.
func (f *Fleet) startGateways(ctx context.Context) error {
	for range max(f.opts.Gateways, 1) {
		if _, err := f.AddGateway(ctx, ""); err != nil {
			return err
		}
	}
	return nil
}

// AddGateway starts another gateway replica, of binary (the fleet's when empty: a
// second build, e.g. an earlier commit's, beside the fleet's own) with the fleet's
// gateway arguments and then args, waits until it is ready and returns its base URL,
// which is appended to GatewayURLs. Each replica has its own --gateway-id
// ("gateway", "gateway-2", ...), its name in the budgets' usage records: replicas
// that shared one would overwrite each other's record and never count each other's
// requests.
func (f *Fleet) AddGateway(ctx context.Context, binary string, args ...string) (string, error) {
	name := "gateway"
	if n := len(f.gateways); n > 0 {
		name = fmt.Sprintf("gateway-%d", n+1)
	}
	gw, err := freePort()
	if err != nil {
		return "", err
	}
	gwProbe, err := freePort()
	if err != nil {
		return "", err
	}
	c := &component{name: name, bin: binary, args: []string{"gateway", "--kubeconfig", f.AdminKubeconfig,
		"--listen", "127.0.0.1:" + strconv.Itoa(gw), "--metrics-bind-address", "0",
		"--health-probe-bind-address", "127.0.0.1:" + strconv.Itoa(gwProbe), "--gateway-id", name},
		readyz: fmt.Sprintf("http://127.0.0.1:%d/readyz", gwProbe)}
	c.args = append(append(c.args, f.opts.GatewayArgs...), args...)
	f.gateways = append(f.gateways, c)
	if err := f.startComponent(ctx, c); err != nil {
		return "", err
	}
	url := "http://127.0.0.1:" + strconv.Itoa(gw)
	f.GatewayURLs = append(f.GatewayURLs, url)
	f.GatewayURL = f.GatewayURLs[0]
	return url, nil
}

func (f *Fleet) logf(format string, args ...any) {
	fmt.Fprintf(f.opts.Log, "%s localfleet: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// installManifests creates the namespaces and applies the node RBAC and the admission
// policy from config/, as an installation from config/ (or the chart) would; with
// replicaReadsByRBAC, also the grant of the weaker mode.
func (f *Fleet) installManifests(ctx context.Context, replicaReadsByRBAC bool) error {
	for _, ns := range []string{v1alpha1.SystemNamespace, v1alpha1.NodeIdentityNamespace, v1alpha1.NodeLeaseNamespace} {
		err := f.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating namespace %s: %w", ns, err)
		}
	}
	dirs := []string{"config/agent", "config/admission"}
	if replicaReadsByRBAC {
		dirs = append(dirs, "config/agent-replica-reads")
	}
	return testenv.KubectlApply(ctx, f.AdminKubeconfig, dirs...)
}

// allowLocalSources creates the SourcePolicy of a fleet on one machine: every
// namespace may use the registries, the model server (plain HTTP on loopback) and the
// files in ModelsDir, and fetches may connect to loopback and to the host's address —
// which the default policy denies everywhere else.
func (f *Fleet) allowLocalSources(ctx context.Context) error {
	u, err := url.Parse(f.ModelsURL)
	if err != nil {
		return fmt.Errorf("the model server's address %q: %w", f.ModelsURL, err)
	}
	hosts := []string{u.Hostname(), "localhost", f.HostIP}
	slices.Sort(hosts)
	hosts = slices.Compact(hosts) // a set: the API refuses duplicates
	sp := &v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.SourcePolicyName},
		Spec: v1alpha1.SourcePolicySpec{
			Rules: []v1alpha1.SourcePolicyRule{{
				Namespaces:      []string{"*"},
				Registries:      []v1alpha1.SourceRegistry{v1alpha1.RegistryHF, v1alpha1.RegistryOllama},
				Hosts:           hosts,
				AllowPlainHTTP:  true,
				FileDirectories: []string{f.ModelsDir},
			}},
			// The host's own address may be a private one, which fetches are denied
			// unless listed.
			AllowedNetworks: []string{"127.0.0.0/8", "::1/128", f.HostIP + "/32"},
		}}
	if err := f.Client.Create(ctx, sp); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the local fleet's SourcePolicy: %w", err)
	}
	return nil
}

// serveModels serves ModelsDir over HTTP on loopback, with range requests (the
// manager reads GGUF headers with them, agents resume downloads with them).
func (f *Fleet) serveModels() error {
	addr := f.opts.ModelsAddr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("the model server: %w", err)
	}
	f.ModelsURL = "http://" + ln.Addr().String()
	f.models = &http.Server{Handler: http.FileServer(http.Dir(f.ModelsDir)), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = f.models.Serve(ln) }()
	return nil
}

// Binary is the macfleet executable the fleet runs, for tests that run its CLI as an
// administrator would.
func (f *Fleet) Binary() string { return f.opts.Binary }

// LogDir is where every process logs.
func (f *Fleet) LogDir() string { return filepath.Join(f.opts.Dir, "logs") }

// APIServerURL is the API server's address for the fleet's components, through the
// relay: a loopback address, which `macfleet nodes credentials` takes only as --server.
func (f *Fleet) APIServerURL() string { return "https://" + f.relay.Addr() }

// CutAPIServer makes the API server unreachable for the fleet: the relay closes every
// connection and refuses new ones.
func (f *Fleet) CutAPIServer() { f.logf("Cutting the fleet off the API server"); f.relay.Cut() }

// RestoreAPIServer makes it reachable again.
func (f *Fleet) RestoreAPIServer() error {
	f.logf("Restoring the API server")
	return f.relay.Restore()
}

// WaitNodeReady waits until a MacNode's Ready condition is True.
func (f *Fleet) WaitNodeReady(ctx context.Context, name string) error {
	return Poll(ctx, 90*time.Second, func() (bool, error) {
		var n v1alpha1.MacNode
		if err := f.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == v1alpha1.MacNodeReady && c.Status == metav1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	}, func() string { return "MacNode " + name + " to be Ready\n" + tail(f.AgentLog(name), 20) })
}

// Stop ends every process, the model server and the API server. Runners the agents
// left behind are stopped too.
func (f *Fleet) Stop() {
	var procs []*Process
	f.mu.Lock()
	for _, a := range f.agents {
		if a.proc != nil {
			procs = append(procs, a.proc)
		}
	}
	for _, c := range append(slices.Clone(f.gateways), f.manager) {
		if c != nil {
			procs = append(procs, c.proc)
		}
	}
	f.mu.Unlock()
	for _, p := range procs {
		if p != nil {
			_ = p.Stop(30 * time.Second)
		}
	}
	for _, a := range f.Agents() {
		if err := stopRecordedRunners(a.StateDir); err != nil {
			f.logf("stopping the runners %s left: %v", a.Node.Name, err)
		}
	}
	if f.models != nil {
		_ = f.models.Close()
	}
	if f.Hub != nil {
		f.Hub.Close()
	}
	if f.relay != nil {
		f.relay.Close()
	}
	if f.Env != nil {
		if err := f.Env.Stop(); err != nil {
			f.logf("%v", err)
		}
	}
}

// stopRecordedRunners stops the runners an agent recorded in its state directory
// (the engine pool's adoption records) and left running: an agent killed by a test leaves them
// for its successor. The records prove which processes are runners.
func stopRecordedRunners(stateDir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := runnerproc.NewProcessFactory(runnerproc.ProcessConfig{StateDir: filepath.Join(stateDir, "runners")}).StopUnclaimed(ctx)
	return err
}

// writeKubeconfig rewrites a kubeconfig to reach the API server through the relay.
func (f *Fleet) writeKubeconfig(src []byte, name string) (string, error) {
	cfg, err := clientcmd.Load(src)
	if err != nil {
		return "", err
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + f.relay.Addr()
	}
	path := filepath.Join(f.opts.Dir, name)
	return path, clientcmd.WriteToFile(*cfg, path)
}

func (f *Fleet) startEnv(name string, env []string, args ...string) (*Process, error) {
	logPath := filepath.Join(f.opts.Dir, "logs", name+".log")
	return startProcess(name, logPath, f.opts.Binary, args, append([]string{"MACFLEET_RUNNER=" + f.opts.Runner}, env...))
}

// HostIP is the first non-loopback IPv4 address of this machine.
func HostIP() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() && !ipn.IP.IsLinkLocalUnicast() {
			return ipn.IP.String(), nil
		}
	}
	return "", errors.New("localfleet: this machine has no non-loopback IPv4 address; " +
		"agents need one (the API server refuses loopback addresses in EndpointSlices)")
}

func freePort() (int, error) { return freePortOn("127.0.0.1") }

func freePortOn(host string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitHTTP polls url until it answers 200, the process exits or ctx ends.
func waitHTTP(ctx context.Context, url string, p *Process) error {
	c := &http.Client{Timeout: 2 * time.Second}
	return Poll(ctx, 2*time.Minute, func() (bool, error) {
		if p.Exited() {
			return false, fmt.Errorf("%s exited: %v\n%s", p.Name, p.Err(), tail(p.Log(), 30))
		}
		resp, err := c.Get(url)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}, func() string { return url + "\n" + tail(p.Log(), 30) })
}

// Poll calls cond every 100 ms until it is done, fails, or the timeout passes; what
// says what was awaited, in the timeout's error.
func Poll(ctx context.Context, timeout time.Duration, cond func() (bool, error), what func() string) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		done, err := cond()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for %s", what())
		case <-t.C:
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
