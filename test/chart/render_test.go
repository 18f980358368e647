package chart

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/macfleet/macfleet/controllers/macnode"
	"github.com/macfleet/macfleet/controllers/scheduler"
	"github.com/macfleet/macfleet/gateway"
	"github.com/macfleet/macfleet/gateway/tenancy/satoken"
	"github.com/macfleet/macfleet/internal/httpserver"
)

// testNamespace is the release namespace of the rendering tests: not macfleet-system,
// so that a namespace the chart failed to template shows.
const testNamespace = "fleet-test"

// render runs `helm template` with the CRDs and --set values and returns the objects.
func render(t *testing.T, set ...string) []*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", "macfleet", chartDir(t), "--namespace", testNamespace, "--include-crds"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return decodeObjects(t, []byte(mustHelm(t, args...)))
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("rendered chart has no %s %s", kind, name)
	return nil
}

func findDeployment(t *testing.T, objs []*unstructured.Unstructured, name string) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(find(t, objs, "Deployment", name).Object, &d); err != nil {
		t.Fatalf("converting Deployment %s: %v", name, err)
	}
	return &d
}

// sourceObjects reads the manifests the chart copies from config/ and returns them
// as the chart must render them: the macfleet-system Namespace left out and objects
// of macfleet-system moved to the release namespace.
func sourceObjects(t *testing.T) map[key]*unstructured.Unstructured {
	t.Helper()
	root := repoRoot(t)
	var files []string
	for _, g := range []string{"config/rbac/*.yaml", "config/rbac/gateway/*.yaml", "config/agent/*.yaml", "config/agent-replica-reads/*.yaml", "config/admission/*.yaml"} {
		m, err := filepath.Glob(filepath.Join(root, g))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	out := map[key]*unstructured.Unstructured{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range decodeObjects(t, data) {
			if o.GetKind() == "Namespace" && o.GetName() == "macfleet-system" {
				continue
			}
			if o.GetNamespace() == "macfleet-system" {
				o.SetNamespace(testNamespace)
			}
			out[keyOf(o)] = o
		}
	}
	return out
}

// normalized drops metadata.labels, which the chart extends, and maps
// subjects' macfleet-system namespace like the objects'.
func normalized(o *unstructured.Unstructured) map[string]any {
	c := o.DeepCopy()
	unstructured.RemoveNestedField(c.Object, "metadata", "labels")
	if subjects, ok, _ := unstructured.NestedSlice(c.Object, "subjects"); ok {
		for _, s := range subjects {
			if m, ok := s.(map[string]any); ok && m["namespace"] == "macfleet-system" {
				m["namespace"] = testNamespace
			}
		}
		_ = unstructured.SetNestedSlice(c.Object, subjects, "subjects")
	}
	return c.Object
}

func TestTemplateObjects(t *testing.T) {
	objs := render(t)

	want := sourceObjects(t)
	for _, k := range []key{
		{"ServiceAccount", testNamespace, "macfleet-manager"},
		{"ServiceAccount", testNamespace, "macfleet-gateway"},
		{"ClusterRoleBinding", "", "macfleet-manager"},
		{"ClusterRoleBinding", "", "macfleet-gateway"},
		{"RoleBinding", testNamespace, "macfleet-manager"},
		{"RoleBinding", "macfleet-nodes", "macfleet-manager"},
		{"RoleBinding", testNamespace, "macfleet-gateway"},
		{"Deployment", testNamespace, "macfleet-manager"},
		{"Deployment", testNamespace, "macfleet-gateway"},
		{"Service", testNamespace, "macfleet-gateway"},
		{"SourcePolicy", "", "default"},
		{"Service", testNamespace, "macfleet-node-authorizer"},
		{"Secret", testNamespace, "macfleet-node-authorizer-tls"},
		{"Secret", testNamespace, "macfleet-node-authorizer-client"},
	} {
		want[k] = nil
	}
	crds, err := filepath.Glob(filepath.Join(repoRoot(t), "config", "crd", "bases", "*.yaml"))
	if err != nil || len(crds) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (%v)", err)
	}
	for _, f := range crds {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range decodeObjects(t, data) {
			want[keyOf(o)] = o
		}
		// crds/ holds the very files: Helm installs them before the templates and
		// never templates them.
		copied, err := os.ReadFile(filepath.Join(chartDir(t), "crds", filepath.Base(f)))
		if err != nil {
			t.Errorf("CRD %s is not in the chart: %v (run `make chart-sync`)", filepath.Base(f), err)
		} else if string(copied) != string(data) {
			t.Errorf("charts/macfleet/crds/%s differs from config/crd/bases (run `make chart-sync`)", filepath.Base(f))
		}
	}

	got := map[key]*unstructured.Unstructured{}
	for _, o := range objs {
		k := keyOf(o)
		if _, dup := got[k]; dup {
			t.Errorf("rendered twice: %v", k)
		}
		got[k] = o
	}
	var wantKeys, gotKeys []string
	for k := range want {
		wantKeys = append(wantKeys, k.Kind+" "+k.Namespace+"/"+k.Name)
	}
	for k := range got {
		gotKeys = append(gotKeys, k.Kind+" "+k.Namespace+"/"+k.Name)
	}
	slices.Sort(wantKeys)
	slices.Sort(gotKeys)
	if diff := cmp.Diff(wantKeys, gotKeys); diff != "" {
		t.Fatalf("rendered objects (-want +got):\n%s", diff)
	}

	for k, src := range want {
		if src == nil || k.Kind == "CustomResourceDefinition" {
			continue
		}
		if diff := cmp.Diff(normalized(src), normalized(got[k])); diff != "" {
			t.Errorf("%v differs from its source in config/ (-config +chart):\n%s", k, diff)
		}
	}

	for k, o := range got {
		if k.Kind == "CustomResourceDefinition" {
			continue
		}
		if l := o.GetLabels(); l["app.kubernetes.io/managed-by"] != "Helm" || l["app.kubernetes.io/instance"] != "macfleet" {
			t.Errorf("%v lacks the chart's labels: %v", k, l)
		}
	}
}

func TestTemplateDeployments(t *testing.T) {
	authzVolume := corev1.Volume{Name: "node-authorizer-tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: "macfleet-node-authorizer-tls", Items: []corev1.KeyToPath{{Key: "tls.crt", Path: "tls.crt"}, {Key: "tls.key", Path: "tls.key"},
			{Key: "ca.crt", Path: "ca.crt"}},
	}}}
	const authzBind, authzCerts = "--node-authorizer-bind-address=:9443", "--node-authorizer-cert-dir=/etc/macfleet/node-authorizer-tls"
	const authzClientCA = "--node-authorizer-client-ca=/etc/macfleet/node-authorizer-tls/ca.crt"
	keysVolume := corev1.Volume{Name: "api-keys", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: "client-keys", Items: []corev1.KeyToPath{{Key: "list", Path: "list"}},
	}}}
	defaultManager := []string{"manager", "--metrics-bind-address=:8080", "--health-probe-bind-address=:8081",
		"--leader-elect=false", "--node-loss-grace=60s", "--scheduler-workers=8",
		authzBind, authzCerts, authzClientCA, "--zap-log-level=info"}
	defaultGateway := []string{"gateway", "--listen=:8080", "--metrics-bind-address=:9090", "--health-probe-bind-address=:8081",
		"--agent-cert-secret=" + testNamespace + "/macfleet-gateway-tls", "--tenant-keys", "--token-audience=macfleet", "--cold-start-timeout=2m", "--stream-keepalive=10s", "--stream-continuations=1", "--stream-continue-timeout=15s", "--prefix-affinity=false",
		"--routing=prefix-cache", "--peer-fetch=true", "--peer-fetch-margin=2", "--max-inflight-per-slot=1", "--max-queue=256", "--max-queue-per-key=0", "--reserve-slots=1", "--active-window=30s",
		"--drain-timeout=600s", "--max-connections=1024", "--zap-log-level=info"}
	tests := []struct {
		name            string
		set             []string
		wantImage       string
		wantManager     []string
		wantStrategy    appsv1.DeploymentStrategyType
		wantGateway     []string // nil: no gateway
		wantGatewayN    int32
		wantVolumes     []corev1.Volume
		wantServicePort int32
	}{{
		name:            "defaults",
		wantImage:       "ghcr.io/macfleet/macfleet:0.1.0",
		wantManager:     defaultManager,
		wantStrategy:    appsv1.RecreateDeploymentStrategyType,
		wantGateway:     defaultGateway,
		wantGatewayN:    1,
		wantServicePort: 80,
	}, {
		name: "replicated, tuned, with API keys",
		set: []string{
			"image.repository=registry.example/mf", "image.tag=v9",
			"manager.replicas=3", "manager.nodeLossGrace=5m", "manager.schedulerWorkers=2",
			"manager.hfEndpoint=https://hf.example", "manager.logLevel=debug", "manager.extraArgs={--zap-devel}",
			"gateway.replicas=4", "gateway.apiKeysSecret=client-keys", "gateway.apiKeysSecretKey=list",
			"gateway.prefixAffinity=true", "gateway.peerFetch=false", "gateway.peerFetchMargin=3", "gateway.coldStartTimeout=30s", "gateway.service.port=8000",
			"gateway.streamContinuations=-1", "gateway.streamContinueTimeout=5s",
			"gateway.queue.maxInFlightPerSlot=2", "gateway.queue.maxQueued=1000", "gateway.queue.maxPerKey=100",
			"gateway.queue.reserveSlots=0", "gateway.queue.activeWindow=2m",
			"gateway.drain.timeoutSeconds=120", "gateway.maxConnections=4096", "gateway.maxConnectionsPerSource=-1",
			"gateway.allowedHosts={gw.example,.corp.example}", "gateway.streamKeepAlive=5s",
		},
		wantImage: "registry.example/mf:v9",
		wantManager: []string{"manager", "--metrics-bind-address=:8080", "--health-probe-bind-address=:8081",
			"--leader-elect=true", "--node-loss-grace=5m", "--scheduler-workers=2",
			authzBind, authzCerts, authzClientCA, "--hf-endpoint=https://hf.example",
			"--zap-log-level=debug", "--zap-devel"},
		wantStrategy: "",
		wantGateway: []string{"gateway", "--listen=:8080", "--metrics-bind-address=:9090", "--health-probe-bind-address=:8081",
			"--agent-cert-secret=" + testNamespace + "/macfleet-gateway-tls", "--api-keys-file=/etc/macfleet/api-keys/list", "--tenant-keys", "--token-audience=macfleet",
			"--cold-start-timeout=30s", "--stream-keepalive=5s", "--stream-continuations=-1", "--stream-continue-timeout=5s", "--prefix-affinity=true", "--routing=prefix-affinity", "--peer-fetch=false", "--peer-fetch-margin=3",
			"--max-inflight-per-slot=2", "--max-queue=1000",
			"--max-queue-per-key=100", "--reserve-slots=0", "--active-window=2m", "--drain-timeout=120s", "--max-connections=4096",
			"--max-connections-per-source=-1", "--allowed-hosts=gw.example,.corp.example", "--zap-log-level=info"},
		wantGatewayN:    4,
		wantVolumes:     []corev1.Volume{keysVolume},
		wantServicePort: 8000,
	}, {
		name:         "open gateway, opted out of keys",
		set:          []string{"gateway.tenantKeys=false"},
		wantImage:    "ghcr.io/macfleet/macfleet:0.1.0",
		wantManager:  defaultManager,
		wantStrategy: appsv1.RecreateDeploymentStrategyType,
		wantGateway: slices.DeleteFunc(slices.Clone(defaultGateway), func(a string) bool {
			return a == "--tenant-keys" || strings.HasPrefix(a, "--token-audience=")
		}),
		wantGatewayN:    1,
		wantServicePort: 80,
	}, {
		name:         "no gateway",
		set:          []string{"gateway.enabled=false"},
		wantImage:    "ghcr.io/macfleet/macfleet:0.1.0",
		wantManager:  defaultManager,
		wantStrategy: appsv1.RecreateDeploymentStrategyType,
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, tc.set...)

			m := findDeployment(t, objs, "macfleet-manager")
			if got := m.Spec.Strategy.Type; got != tc.wantStrategy {
				t.Errorf("manager strategy = %q, want %q", got, tc.wantStrategy)
			}
			checkPod(t, &m.Spec.Template.Spec, "macfleet-manager", tc.wantImage, tc.wantManager)
			if diff := cmp.Diff([]corev1.Volume{authzVolume}, m.Spec.Template.Spec.Volumes); diff != "" {
				t.Errorf("manager volumes (-want +got):\n%s", diff)
			}
			if vm := m.Spec.Template.Spec.Containers[0].VolumeMounts; len(vm) != 1 || vm[0].Name != authzVolume.Name ||
				!vm[0].ReadOnly || vm[0].MountPath != "/etc/macfleet/node-authorizer-tls" {
				t.Errorf("manager volume mounts %+v, want the node authorizer's certificate read-only under /etc/macfleet", vm)
			}

			var gw []string
			for _, o := range objs {
				if o.GetName() == "macfleet-gateway" {
					gw = append(gw, o.GetKind())
				}
			}
			if tc.wantGateway == nil {
				if len(gw) > 0 {
					t.Fatalf("gateway disabled, but rendered %v named macfleet-gateway", gw)
				}
				return
			}
			g := findDeployment(t, objs, "macfleet-gateway")
			if got := ptr.Deref(g.Spec.Replicas, 0); got != tc.wantGatewayN {
				t.Errorf("gateway replicas = %d, want %d", got, tc.wantGatewayN)
			}
			checkPod(t, &g.Spec.Template.Spec, "macfleet-gateway", tc.wantImage, tc.wantGateway)
			if diff := cmp.Diff(tc.wantVolumes, g.Spec.Template.Spec.Volumes); diff != "" {
				t.Errorf("gateway volumes (-want +got):\n%s", diff)
			}
			for _, v := range tc.wantVolumes {
				mounted := slices.ContainsFunc(g.Spec.Template.Spec.Containers[0].VolumeMounts, func(vm corev1.VolumeMount) bool {
					return vm.Name == v.Name && vm.ReadOnly && vm.SubPath == "" && strings.HasPrefix(vm.MountPath, "/etc/macfleet/")
				})
				if !mounted {
					t.Errorf("volume %s is not mounted read-only, whole, under /etc/macfleet/", v.Name)
				}
			}

			var svc corev1.Service
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(find(t, objs, "Service", "macfleet-gateway").Object, &svc); err != nil {
				t.Fatal(err)
			}
			wantPorts := []corev1.ServicePort{{Name: "http", Port: tc.wantServicePort, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP}}
			if diff := cmp.Diff(wantPorts, svc.Spec.Ports); diff != "" {
				t.Errorf("gateway Service ports (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(g.Spec.Selector.MatchLabels, svc.Spec.Selector); diff != "" {
				t.Errorf("gateway Service selects other pods than the Deployment's (-deployment +service):\n%s", diff)
			}
			hasPDB := slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool {
				return o.GetKind() == "PodDisruptionBudget" && o.GetName() == "macfleet-gateway"
			})
			if want := tc.wantGatewayN > 1; hasPDB != want {
				t.Errorf("gateway PodDisruptionBudget rendered: %v, want %v with %d replicas", hasPDB, want, tc.wantGatewayN)
			}
			ports := g.Spec.Template.Spec.Containers[0].Ports
			if !slices.ContainsFunc(ports, func(p corev1.ContainerPort) bool { return p.Name == "http" && p.ContainerPort == 8080 }) {
				t.Errorf("gateway container ports %v lack http=8080", ports)
			}
		})
	}
}

// checkPod checks what both Deployments share: their ServiceAccount, image, args,
// probes and a non-root, read-only, capability-less container.
func checkPod(t *testing.T, pod *corev1.PodSpec, serviceAccount, image string, args []string) {
	t.Helper()
	if pod.ServiceAccountName != serviceAccount {
		t.Errorf("serviceAccountName = %q, want %q", pod.ServiceAccountName, serviceAccount)
	}
	if sc := pod.SecurityContext; sc == nil || !ptr.Deref(sc.RunAsNonRoot, false) || ptr.Deref(sc.RunAsUser, 0) == 0 ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext = %+v, want non-root with a RuntimeDefault seccomp profile", sc)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.Image != image {
		t.Errorf("image = %q, want %q", c.Image, image)
	}
	if len(c.Command) != 0 {
		t.Errorf("command = %v, want the image's entrypoint", c.Command)
	}
	if diff := cmp.Diff(args, c.Args); diff != "" {
		t.Errorf("args (-want +got):\n%s", diff)
	}
	sc := c.SecurityContext
	if sc == nil || !ptr.Deref(sc.ReadOnlyRootFilesystem, false) || ptr.Deref(sc.AllowPrivilegeEscalation, true) ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container securityContext = %+v, want a read-only root, no privilege escalation, all capabilities dropped", sc)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "probes" }) {
		t.Errorf("container ports %v lack one named probes", c.Ports)
	}
	for _, p := range []struct {
		name, path string
		probe      *corev1.Probe
	}{{"liveness", "/healthz", c.LivenessProbe}, {"readiness", "/readyz", c.ReadinessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "probes" {
			t.Errorf("%s probe = %+v, want GET %s on the container port named probes", p.name, p.probe, p.path)
		}
	}
	if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources = %+v, want memory requests and limits", c.Resources)
	}
}

// TestTemplateFlagsExist runs the real binary's --help and checks that every flag the
// chart passes exists, so a renamed flag cannot leave the chart starting pods that
// exit at once.
func TestTemplateFlagsExist(t *testing.T) {
	bin := buildLikeDockerfile(t)
	objs := render(t, "manager.hfEndpoint=https://hf.example", "manager.ollamaRegistry=https://ollama.example",
		"gateway.apiKeysSecret=keys", "gateway.console=false", "gateway.tenantKeys=true", "gateway.tls.terminate=true",
		"gateway.tunnel.enabled=true")
	flagName := regexp.MustCompile(`^(--[a-z0-9-]+)`)
	for _, name := range []string{"macfleet-manager", "macfleet-gateway"} {
		args := findDeployment(t, objs, name).Spec.Template.Spec.Containers[0].Args
		out, err := exec.CommandContext(t.Context(), bin, args[0], "--help").CombinedOutput()
		if err != nil {
			t.Fatalf("macfleet %s --help: %v\n%s", args[0], err, out)
		}
		for _, a := range args[1:] {
			f := flagName.FindString(a)
			if f == "" || !regexp.MustCompile(`(^|\s)`+regexp.QuoteMeta(f)+`[\s=]`).Match(out) {
				t.Errorf("%s passes %q, which `macfleet %s --help` does not list", name, a, args[0])
			}
		}
	}
}

// TestValuesMatchBinaryDefaults keeps values.yaml's documented defaults equal to the
// binaries' own, so that leaving a value alone means the same in and out of the chart.
func TestValuesMatchBinaryDefaults(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir(t), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Manager struct {
			NodeLossGrace    string `json:"nodeLossGrace"`
			SchedulerWorkers int    `json:"schedulerWorkers"`
			MetricsPort      int    `json:"metricsPort"`
			ProbePort        int    `json:"probePort"`
		} `json:"manager"`
		Gateway struct {
			ColdStartTimeout string `json:"coldStartTimeout"`
			MaxConnections   int    `json:"maxConnections"`
			Drain            struct {
				TimeoutSeconds int `json:"timeoutSeconds"`
			} `json:"drain"`
			PrefixAffinity bool   `json:"prefixAffinity"`
			Routing        string `json:"routing"`
			TokenAudience  string `json:"tokenAudience"`
			Port           int    `json:"port"`
			MetricsPort    int    `json:"metricsPort"`
			ProbePort      int    `json:"probePort"`
		} `json:"gateway"`
	}
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	dur := func(s string) time.Duration {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Errorf("values.yaml: %v", err)
		}
		return d
	}
	type defaults struct {
		NodeLossGrace, ColdStartTimeout           time.Duration
		SchedulerWorkers                          int
		ManagerMetrics, ManagerProbe              int
		GatewayPort, GatewayMetrics, GatewayProbe int
		PrefixAffinity                            bool
		Routing                                   string
		TokenAudience                             string
		DrainTimeout                              time.Duration
		MaxConnections                            int
	}
	got := defaults{
		NodeLossGrace: dur(v.Manager.NodeLossGrace), ColdStartTimeout: dur(v.Gateway.ColdStartTimeout),
		SchedulerWorkers: v.Manager.SchedulerWorkers, ManagerMetrics: v.Manager.MetricsPort, ManagerProbe: v.Manager.ProbePort,
		GatewayPort: v.Gateway.Port, GatewayMetrics: v.Gateway.MetricsPort, GatewayProbe: v.Gateway.ProbePort,
		PrefixAffinity: v.Gateway.PrefixAffinity, Routing: v.Gateway.Routing, TokenAudience: v.Gateway.TokenAudience,
		DrainTimeout: time.Duration(v.Gateway.Drain.TimeoutSeconds) * time.Second, MaxConnections: v.Gateway.MaxConnections,
	}
	// The ports are the flags' defaults in cmd/macfleet (manager.go, gateway.go).
	want := defaults{
		NodeLossGrace: macnode.DefaultNodeLossGrace, ColdStartTimeout: gateway.DefaultColdStartTimeout,
		SchedulerWorkers: scheduler.DefaultWorkers, ManagerMetrics: 8080, ManagerProbe: 8081,
		GatewayPort: 8080, GatewayMetrics: 9090, GatewayProbe: 8081, TokenAudience: satoken.DefaultAudience,
		Routing:      string(gateway.RoutingPrefixCache),
		DrainTimeout: gateway.DefaultDrainTimeout, MaxConnections: httpserver.DefaultMaxConnections,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("values.yaml defaults differ from the binaries' (-binary +values):\n%s", diff)
	}
}

func TestValuesSchemaRejects(t *testing.T) {
	tests := []struct {
		set  string
		want []string // all in helm's error
	}{
		{"manager.replica=2", []string{"manager", "replica"}},
		{"manager.replicas=0", []string{"manager/replicas", "minimum"}},
		{"manager.nodeLossGrace=5 minutes", []string{"manager/nodeLossGrace"}},
		{"manager.schedulerWorkers=many", []string{"manager/schedulerWorkers"}},
		{"manager.hfEndpoint=huggingface.co", []string{"manager/hfEndpoint"}},
		{"image.pullPolicy=Sometimes", []string{"image/pullPolicy"}},
		{"gateway.service.type=Ingress", []string{"gateway/service/type"}},
		{"gateway.apiKeysSecret=Not_A_Name", []string{"gateway/apiKeysSecret"}},
		{"gateway.coldStartTimeout=2", []string{"gateway/coldStartTimeout"}},
		{"gateway.routing=random", []string{"gateway/routing"}},
		{"gateway.queue.maxQueued=0", []string{"gateway/queue/maxQueued"}},
		{"placement.strategy=Spread", []string{"placement"}},
		{"monitoring.dashboards.enable=true", []string{"monitoring/dashboards", "enable"}},
		{"monitoring.dashboards.namespace=Grafana", []string{"monitoring/dashboards/namespace"}},
		{"monitoring.podMonitor.interval=30", []string{"monitoring/podMonitor/interval"}},
		{"monitoring.prometheusRule.ttftP99Seconds=0", []string{"monitoring/prometheusRule/ttftP99Seconds"}},
		{"monitoring.prometheusRule.errorRatio=2", []string{"monitoring/prometheusRule/errorRatio"}},
		{"monitoring.prometheusRule.agentJob=a\"b", []string{"monitoring/prometheusRule/agentJob"}},
		{"gateway.access.hostnames={Not A Name}", []string{"gateway/access/hostnames"}},
		{"gateway.access.httpRoute.timeouts.request=1 hour", []string{"gateway/access/httpRoute/timeouts/request"}},
		{"gateway.access.ingress.streaming.timeoutSeconds=5", []string{"gateway/access/ingress/streaming/timeoutSeconds", "minimum"}},
		{"gateway.tls.secretName=Not_A_Name", []string{"gateway/tls/secretName"}},
		{"networkPolicy.enable=true", []string{"networkPolicy", "enable"}},
		{"networkPolicy.agents.cidrs={192.168.10.0}", []string{"networkPolicy/agents/cidrs"}},
		{"networkPolicy.apiServer.ports={0}", []string{"networkPolicy/apiServer/ports"}},
		{"networkPolicy.gateway.apiPeers[0].cidr=10.0.0.0/8", []string{"networkPolicy/gateway/apiPeers", "cidr"}},
		{"networkPolicy.manager.modelSources.ipBlocks[0].except={metadata}", []string{"networkPolicy/manager/modelSources/ipBlocks"}},
	}
	for _, tc := range tests {
		t.Run(tc.set, func(t *testing.T) {
			_, err := helm(t, "template", "macfleet", chartDir(t), "--set", tc.set)
			if err == nil {
				t.Fatalf("helm template --set %s succeeded, want a schema error", tc.set)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestLint(t *testing.T) {
	for _, set := range [][]string{nil, {"manager.replicas=2", "gateway.apiKeysSecret=keys"}, {"gateway.enabled=false"}, monitoringOn, networkPolicyOn, accessOn} {
		args := []string{"lint", "--strict", chartDir(t)}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Errorf("%v\n%s", err, out)
		}
	}
}
