package nodeauthz_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	authzv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/nodeauthz"
	"github.com/macfleet/macfleet/test/support/localfleet"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// The package's API server asks a webhook served by the test, with the shipped
// config/authorization/authorization-config.yaml and the shipped node RBAC — the
// fallback grant of every replica read (config/agent-replica-reads, the chart's default
// mode auto) included, which the webhook's denials must override.
var (
	envOpts   []testenv.Option
	webhookLn net.Listener
	certDir   string
	authz     localfleet.NodeAuthorizer
	serveOnce sync.Once
	env       *testenv.Env
	envErr    error
	// stop ends the webhook and its cache, whose watch would hold up the API server's
	// shutdown.
	ctx  context.Context
	stop context.CancelFunc
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "nodeauthz-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	// The API server learns the webhook's address at its start; the test serves it
	// once the server is up (serve).
	if webhookLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer webhookLn.Close()
	na, err := localfleet.WriteNodeAuthorizer(dir, webhookLn.Addr().String())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	certDir, authz = na.CertDir, na
	envOpts = []testenv.Option{testenv.WithScheme(v1alpha1.AddToScheme), testenv.WithAuthorizationConfig(na.AuthorizationConfig)}
	ctrllog.SetLogger(logr.Discard())
	ctx, stop = context.WithCancel(context.Background())
	code := m.Run()
	stop()
	if env != nil {
		if err := env.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = max(code, 1)
		}
	}
	return code
}

// serve starts the API server with the node RBAC installed and the webhook answering
// from an informer cache of ModelReplicas, as the manager's does.
func serve(tb testing.TB) *testenv.Env {
	tb.Helper()
	serveOnce.Do(func() {
		if env, envErr = testenv.New(envOpts...); envErr != nil {
			return
		}
		if envErr = env.Apply(ctx, "config/agent"); envErr != nil {
			return
		}
		if envErr = env.Apply(ctx, "config/agent-replica-reads"); envErr != nil {
			return
		}
		var c cache.Cache
		if c, envErr = cache.New(env.Config, cache.Options{Scheme: env.Scheme}); envErr != nil {
			return
		}
		if _, envErr = c.GetInformer(ctx, &v1alpha1.ModelReplica{}); envErr != nil {
			return
		}
		go func() { _ = c.Start(ctx) }()
		webhook := &nodeauthz.Handler{Lookup: nodeauthz.CacheLookup(c, logr.Discard()), Log: logr.Discard()}
		var crt tls.Certificate
		if crt, envErr = tls.LoadX509KeyPair(filepath.Join(certDir, "tls.crt"), filepath.Join(certDir, "tls.key")); envErr != nil {
			return
		}
		var tlsCfg *tls.Config
		getCert := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &crt, nil }
		if tlsCfg, envErr = nodeauthz.TLSConfig(getCert, authz.ClientCA); envErr != nil {
			return
		}
		mux := http.NewServeMux()
		mux.Handle(nodeauthz.Path, webhook)
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(tls.NewListener(webhookLn, tlsCfg)) }()
		go func() { <-ctx.Done(); _ = srv.Close() }()
	})
	if envErr != nil {
		tb.Fatal(envErr)
	}
	return env
}

// as returns a client acting as user in groups (impersonation).
func as(tb testing.TB, env *testenv.Env, user string, groups ...string) client.Client {
	tb.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
	cfg.QPS, cfg.Burst = 1000, 1000
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

func asNode(tb testing.TB, env *testenv.Env, node string) client.Client {
	return as(tb, env, "system:serviceaccount:"+v1alpha1.NodeIdentityNamespace+":"+node,
		"system:serviceaccounts", "system:serviceaccounts:"+v1alpha1.NodeIdentityNamespace)
}

func newReplica(ns, name, node string) *v1alpha1.ModelReplica {
	return &v1alpha1.ModelReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ModelReplicaSpec{
			Template:     v1alpha1.ModelReplicaTemplate{Model: v1alpha1.ModelSource{Source: "hf://tenant-" + ns + "/secret-model"}},
			TemplateHash: "h", MemoryReservation: resource.MustParse("1Gi"), NodeName: node,
		},
	}
}

// TestAPIServerAsksTheNodeAuthorizer: through the real API server, the shipped
// authorization configuration and RBAC, a node reads only the replicas bound to it —
// and a replica once it is bound to it, not before.
func TestAPIServerAsksTheNodeAuthorizer(t *testing.T) {
	env := serve(t)
	ctx := t.Context()
	ns := testenv.NewNamespace(t, env.Client)
	for _, r := range []*v1alpha1.ModelReplica{newReplica(ns, "mine", "mac-a"), newReplica(ns, "theirs", "mac-b"), newReplica(ns, "pending", "")} {
		if err := env.Client.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	node := asNode(t, env, "mac-a")
	own := client.MatchingFields{v1alpha1.ReplicaNodeNameField: "mac-a"}

	var list v1alpha1.ModelReplicaList
	if err := node.List(ctx, &list, own); err != nil || len(list.Items) != 1 || list.Items[0].Name != "mine" {
		t.Errorf("listing its replicas: %v, %d items, want only %s/mine", err, len(list.Items), ns)
	}
	if err := node.List(ctx, &list, client.InNamespace(ns), own); err != nil {
		t.Errorf("listing its replicas of one namespace: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		err := node.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mine"}, &v1alpha1.ModelReplica{})
		return err == nil, fmt.Sprintf("getting its replica: %v", err)
	})
	for what, err := range map[string]error{
		"list every replica":          node.List(ctx, &list),
		"list a namespace's replicas": node.List(ctx, &list, client.InNamespace(ns)),
		"list another Mac's":          node.List(ctx, &list, client.MatchingFields{v1alpha1.ReplicaNodeNameField: "mac-b"}),
		"get another Mac's":           node.Get(ctx, client.ObjectKey{Namespace: ns, Name: "theirs"}, &v1alpha1.ModelReplica{}),
		"get an unbound one":          node.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pending"}, &v1alpha1.ModelReplica{}),
		"list ModelDeployments":       node.List(ctx, &v1alpha1.ModelDeploymentList{}),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want 403 Forbidden", what, err)
		}
	}

	// Bound to mac-a, the pending replica becomes readable (no denial is cached).
	var pending v1alpha1.ModelReplica
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pending"}, &pending); err != nil {
		t.Fatal(err)
	}
	pending.Spec.NodeName = "mac-a"
	if err := env.Client.Update(ctx, &pending); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		err := node.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pending"}, &v1alpha1.ModelReplica{})
		return err == nil, fmt.Sprintf("getting the replica just bound to it: %v", err)
	})

	// Anyone else is not asked: an administrator reads everything, another
	// ServiceAccount only what RBAC grants it.
	if err := env.Client.List(ctx, &list); err != nil {
		t.Errorf("the administrator listing replicas: %v", err)
	}
	other := as(t, env, "system:serviceaccount:"+ns+":mac-a", "system:serviceaccounts")
	if err := other.List(ctx, &list, own); !apierrors.IsForbidden(err) {
		t.Errorf("a ServiceAccount of another namespace named mac-a listing with the selector: %v, want 403", err)
	}
}

// TestPreflightNamesWebhook: where the API server asks the node authorizer before
// RBAC, the preflight says so, although RBAC grants every replica read (mode auto).
func TestPreflightNamesWebhook(t *testing.T) {
	env := serve(t)
	mode, err := nodeauthz.Preflight(t.Context(), kubernetes.NewForConfigOrDie(env.Config))
	if err != nil || mode != nodeauthz.ModeWebhook {
		t.Errorf("Preflight = %q, %v; want %q", mode, err, nodeauthz.ModeWebhook)
	}
}

// sar asks the API server whether user may do attrs (a SubjectAccessReview, which runs
// the authorization chain as a request would).
func sar(tb testing.TB, c client.Client, user string, groups []string, attrs authzv1.ResourceAttributes) bool {
	tb.Helper()
	r := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &attrs}}
	if err := c.Create(tb.Context(), r); err != nil {
		tb.Fatal(err)
	}
	return r.Status.Allowed
}

// TestWebhookAnswersOnlyTheAPIServer: with a client CA the webhook answers a caller
// whose certificate that CA signed (the API server above, through its kubeconfig, and
// a test client here); a caller that reaches its port without one — which could
// otherwise ask which Mac a replica is bound to — fails the TLS handshake.
func TestWebhookAnswersOnlyTheAPIServer(t *testing.T) {
	serve(t)
	serverCA := x509.NewCertPool()
	pemCA, err := os.ReadFile(filepath.Join(certDir, "tls.crt"))
	if err != nil || !serverCA.AppendCertsFromPEM(pemCA) {
		t.Fatalf("the webhook's CA: %v", err)
	}
	review := `{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{"user":"system:serviceaccount:macfleet-nodes:mac-a",` +
		`"resourceAttributes":{"group":"macfleet.dev","resource":"modelreplicas","verb":"get","namespace":"x","name":"y"}}}`
	post := func(certs []tls.Certificate) (*http.Response, error) {
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: serverCA, Certificates: certs, MinVersion: tls.VersionTLS12}}}
		defer c.CloseIdleConnections()
		return c.Post(authz.URL, "application/json", strings.NewReader(review))
	}
	if resp, err := post(nil); err == nil {
		resp.Body.Close()
		t.Errorf("a caller without a client certificate got %s, want a failed handshake", resp.Status)
	}
	client, err := tls.LoadX509KeyPair(authz.ClientCert, authz.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := post([]tls.Certificate{client})
	if err != nil {
		t.Fatalf("a caller with a certificate of the client CA: %v", err)
	}
	defer resp.Body.Close()
	var got authzv1.SubjectAccessReview
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK || got.Status.Allowed {
		t.Errorf("a caller with a certificate of the client CA: %s, %+v (%v); want 200, not allowed (no such replica)", resp.Status, got.Status, err)
	}
}

// TestAPIServerLetsWorkerShardsRead: through the real API server, a Mac holding a
// worker shard of a split replica lists, watches and gets it by its worker label, and a
// third Mac of the fleet reads none of it.
func TestAPIServerLetsWorkerShardsRead(t *testing.T) {
	env := serve(t)
	ctx := t.Context()
	ns := testenv.NewNamespace(t, env.Client)
	split := newReplica(ns, "split", "mac-a")
	split.Labels = map[string]string{v1alpha1.ShardLabel("mac-b"): v1alpha1.ShardLabelWorker}
	split.Spec.Split = &v1alpha1.ReplicaSplit{Shards: []v1alpha1.ReplicaShard{
		{Node: "mac-a", FirstLayer: 0, LastLayer: 3, Memory: resource.MustParse("1Gi")},
		{Node: "mac-b", FirstLayer: 4, LastLayer: 7, Memory: resource.MustParse("1Gi")},
	}}
	if err := env.Client.Create(ctx, split); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, newReplica(ns, "b-alone", "mac-b")); err != nil {
		t.Fatal(err)
	}
	worker := asNode(t, env, "mac-b")
	var list v1alpha1.ModelReplicaList
	shards := client.HasLabels{v1alpha1.ShardLabel("mac-b")}
	if err := worker.List(ctx, &list, shards); err != nil || len(list.Items) != 1 || list.Items[0].Name != "split" {
		t.Errorf("mac-b listing its worker shards: %v, %d items, want only %s/split", err, len(list.Items), ns)
	}
	if err := worker.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{v1alpha1.ShardLabel("mac-b"): v1alpha1.ShardLabelWorker}); err != nil || len(list.Items) != 1 {
		t.Errorf("mac-b listing its worker shards of one namespace by value: %v, %d items", err, len(list.Items))
	}
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + v1alpha1.NodeIdentityNamespace + ":mac-b",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + v1alpha1.NodeIdentityNamespace, "system:authenticated"}}
	watcher, err := client.NewWithWatch(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	w, err := watcher.Watch(ctx, &v1alpha1.ModelReplicaList{}, shards)
	if err != nil {
		t.Errorf("mac-b watching its worker shards: %v", err)
	} else {
		w.Stop()
	}
	testenv.Eventually(t, 10*time.Second, 20*time.Millisecond, func() (bool, string) {
		err := worker.Get(ctx, client.ObjectKey{Namespace: ns, Name: "split"}, &v1alpha1.ModelReplica{})
		return err == nil, fmt.Sprintf("mac-b getting the replica it holds a worker shard of: %v", err)
	})

	third := asNode(t, env, "mac-c")
	for what, err := range map[string]error{
		"list mac-b's worker shards":   third.List(ctx, &list, shards),
		"list replicas with any label": third.List(ctx, &list, client.HasLabels{v1alpha1.LabelDeployment}),
		"get the split replica":        third.Get(ctx, client.ObjectKey{Namespace: ns, Name: "split"}, &v1alpha1.ModelReplica{}),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("mac-c: %s: %v, want 403 Forbidden", what, err)
		}
	}
	if err := third.List(ctx, &list, client.HasLabels{v1alpha1.ShardLabel("mac-c")}); err != nil || len(list.Items) != 0 {
		t.Errorf("mac-c listing its own worker shards: %v, %d items, want none", err, len(list.Items))
	}
}
