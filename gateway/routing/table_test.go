package routing

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/peerfetch"
)

func TestBuildTableRoutableReplicas(t *testing.T) {
	const T, F, U = metav1.ConditionTrue, metav1.ConditionFalse, metav1.ConditionUnknown
	deleting := replica("a", "qwen-gone", "qwen", "mac1", "10.0.0.1:8080", T)
	deleting.DeletionTimestamp = &metav1.Time{}
	draining := replica("a", "qwen-leaving", "qwen", "mac1", "10.0.0.1:8080", T)
	draining.Spec.Drain = &metav1.Time{}
	tests := []struct {
		name     string
		replicas []mfv1.ModelReplica
		want     []Backend
		existing int
	}{
		{
			name: "ready replica on a ready Mac",
			replicas: []mfv1.ModelReplica{replica("a", "qwen-1", "qwen", "mac1", "10.0.0.1:8080", T),
				withContext(withParallel(replica("a", "qwen-0", "qwen", "mac2", "10.0.0.2:8080", T), 4), 8192)},
			want: []Backend{{"a/qwen-0", "10.0.0.2:8080", "mac2", 4, 8192, peerfetch.Link{}},
				{"a/qwen-1", "10.0.0.1:8080", "mac1", 1, 0, peerfetch.Link{}}},
			existing: 2,
		},
		{name: "replica not ready", replicas: []mfv1.ModelReplica{replica("a", "q", "qwen", "mac1", "10.0.0.1:8080", F)}, existing: 1},
		{name: "no ready condition yet", replicas: []mfv1.ModelReplica{replica("a", "q", "qwen", "mac1", "10.0.0.1:8080", "")}, existing: 1},
		{name: "no endpoint", replicas: []mfv1.ModelReplica{replica("a", "q", "qwen", "mac1", "", T)}, existing: 1},
		{name: "unbound", replicas: []mfv1.ModelReplica{replica("a", "q", "qwen", "", "10.0.0.1:8080", T)}, existing: 1},
		{name: "Mac NotReady (lease expired)", replicas: []mfv1.ModelReplica{replica("a", "q", "qwen", "mac3", "10.0.0.3:8080", T)}, existing: 1},
		{name: "Mac Ready unknown", replicas: []mfv1.ModelReplica{replica("a", "q", "qwen", "mac4", "10.0.0.4:8080", T)}, existing: 1},
		{name: "Mac missing", replicas: []mfv1.ModelReplica{replica("a", "q", "qwen", "nomac", "10.0.0.5:8080", T)}, existing: 1},
		{name: "being deleted", replicas: []mfv1.ModelReplica{deleting}},
		{name: "draining (the deployment removes it)", replicas: []mfv1.ModelReplica{draining}},
		{name: "other namespace's deployment", replicas: []mfv1.ModelReplica{replica("b", "q", "qwen", "mac1", "10.0.0.1:8080", T)}},
		{name: "no deployment label", replicas: []mfv1.ModelReplica{replica("a", "q", "", "mac1", "10.0.0.1:8080", T)}},
	}
	nodes := []mfv1.MacNode{node("mac1", T), node("mac2", T), node("mac3", F), node("mac4", U)}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tbl := BuildTable([]mfv1.ModelDeployment{deployment("a", "qwen", "")}, tt.replicas, nodes)
			rt, aerr := tbl.Resolve("qwen")
			if aerr != nil {
				t.Fatal(aerr)
			}
			if d := cmp.Diff(tt.want, rt.Backends); d != "" {
				t.Errorf("backends (-want +got):\n%s", d)
			}
			if rt.Replicas != tt.existing {
				t.Errorf("replicas %d, want %d", rt.Replicas, tt.existing)
			}
		})
	}
}

func TestUnavailable(t *testing.T) {
	zero := deployment("a", "zero", "")
	zero.Spec.Replicas = ptr.To[int32](0)
	unsched := deployment("a", "big", "")
	unsched.Status.Conditions = []metav1.Condition{{Type: mfv1.DeploymentScheduled, Status: metav1.ConditionFalse,
		Reason: mfv1.ReasonUnschedulable, Message: "0/2 Macs have 96Gi free"}}
	pending := deployment("a", "pending", "")
	pending.Status.Conditions = []metav1.Condition{{Type: mfv1.DeploymentScheduled, Status: metav1.ConditionFalse,
		Reason: mfv1.ReasonScheduledPending}}
	defaulted := deployment("a", "default", "")
	defaulted.Spec.Replicas = nil
	tests := []struct {
		d    mfv1.ModelDeployment
		want string
	}{
		{zero, "scaled to zero"},
		{unsched, "cannot be placed: 0/2 Macs have 96Gi free"},
		{pending, ""},
		{defaulted, ""},
	}
	for _, tt := range tests {
		got := unavailable(&tt.d)
		if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
			t.Errorf("unavailable(%s) = %q, want %q", tt.d.Name, got, tt.want)
		}
	}
}

// TestBuildTablePeerWarmup: a route is warmed from its peers only when its deployment
// opts in (spec.engine.promptCache.peerWarmup) and keeps a prompt cache.
func TestBuildTablePeerWarmup(t *testing.T) {
	tests := []struct {
		name string
		pc   *mfv1.PromptCacheSpec
		want bool
	}{
		{name: "no prompt cache settings"},
		{name: "cache settings without peerWarmup", pc: &mfv1.PromptCacheSpec{HotBytes: ptr.To(resource.MustParse("1Gi"))}},
		{name: "peerWarmup false", pc: &mfv1.PromptCacheSpec{PeerWarmup: ptr.To(false)}},
		{name: "peerWarmup true", pc: &mfv1.PromptCacheSpec{PeerWarmup: ptr.To(true)}, want: true},
		{name: "peerWarmup true, enabled true", pc: &mfv1.PromptCacheSpec{Enabled: ptr.To(true), PeerWarmup: ptr.To(true)}, want: true},
		{name: "peerWarmup true, cache off", pc: &mfv1.PromptCacheSpec{Enabled: ptr.To(false), PeerWarmup: ptr.To(true)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := deployment("a", "qwen", "")
			d.Spec.Engine.PromptCache = tt.pc
			rt, aerr := BuildTable([]mfv1.ModelDeployment{d}, nil, nil).Resolve("a/qwen")
			if aerr != nil {
				t.Fatal(aerr)
			}
			if rt.PeerWarmup != tt.want {
				t.Errorf("PeerWarmup %v, want %v", rt.PeerWarmup, tt.want)
			}
		})
	}
}

// TestRoutingKey: only changes that can change the table rebuild it.
func TestRoutingKey(t *testing.T) {
	r := replica("a", "r", "m", "mac", "10.0.0.1:8080", metav1.ConditionTrue)
	n := node("mac", metav1.ConditionTrue)
	d := deployment("a", "m", "")
	tests := []struct {
		name   string
		before any
		change func() any
		want   bool // rebuild
	}{
		{"replica download progress", &r, func() any {
			c := r.DeepCopy()
			c.Status.Progress = &mfv1.DownloadProgress{DownloadedBytes: 5}
			c.Status.Phase = mfv1.ReplicaDownloading
			return c
		}, false},
		{"replica ready", &r, func() any {
			c := r.DeepCopy()
			c.Status.Conditions[0].Status = metav1.ConditionFalse
			return c
		}, true},
		{"replica endpoint", &r, func() any {
			c := r.DeepCopy()
			c.Status.Endpoint = "10.0.0.2:8080"
			return c
		}, true},
		{"replica deleted", &r, func() any {
			c := r.DeepCopy()
			c.DeletionTimestamp = &metav1.Time{}
			return c
		}, true},
		{"replica draining", &r, func() any {
			c := r.DeepCopy()
			c.Spec.Drain = &metav1.Time{}
			return c
		}, true},
		{"node memory", &n, func() any {
			c := n.DeepCopy()
			c.Status.Agent.Address = "x"
			c.Labels = map[string]string{"a": "b"}
			return c
		}, false},
		{"node not ready", &n, func() any {
			c := n.DeepCopy()
			c.Status.Conditions[0].Status = metav1.ConditionUnknown
			return c
		}, true},
		{"deployment status counts", &d, func() any {
			c := d.DeepCopy()
			c.Status.ReadyReplicas = 3
			return c
		}, false},
		{"deployment alias", &d, func() any {
			c := d.DeepCopy()
			c.Spec.Model.Aliases = []string{"x"}
			return c
		}, true},
		{"deployment scaled", &d, func() any {
			c := d.DeepCopy()
			c.Spec.Replicas = ptr.To[int32](0)
			return c
		}, true},
		{"deployment prompt cache off", &d, func() any {
			c := d.DeepCopy()
			c.Spec.Engine.PromptCache = &mfv1.PromptCacheSpec{Enabled: ptr.To(false)}
			return c
		}, true},
		{"deployment prompt cache sizes", &d, func() any {
			c := d.DeepCopy()
			c.Spec.Engine.PromptCache = &mfv1.PromptCacheSpec{SSDBytes: ptr.To(resource.MustParse("1Gi"))}
			return c
		}, false},
		{"deployment peer warm-up on", &d, func() any {
			c := d.DeepCopy()
			c.Spec.Engine.PromptCache = &mfv1.PromptCacheSpec{PeerWarmup: ptr.To(true)}
			return c
		}, true},
		{"deployment peer warm-up off, said", &d, func() any {
			c := d.DeepCopy()
			c.Spec.Engine.PromptCache = &mfv1.PromptCacheSpec{PeerWarmup: ptr.To(false)}
			return c
		}, false},
	}
	for _, tt := range tests {
		if got := Key(tt.before) != Key(tt.change()); got != tt.want {
			t.Errorf("%s: rebuild %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestDeclaredLink: a Mac's link prior is spec.link where the operator set it, else
// the agent's status.link, else nothing; half its bandwidth, in bytes/s.
func TestDeclaredLink(t *testing.T) {
	link := func(bw string, rtt time.Duration) *mfv1.Link {
		l := &mfv1.Link{RTT: &metav1.Duration{Duration: rtt}}
		if bw != "" {
			l.Bandwidth = ptr.To(resource.MustParse(bw))
		}
		return l
	}
	for _, tc := range []struct {
		name         string
		spec, status *mfv1.Link
		want         peerfetch.Link
	}{
		{name: "neither"},
		{name: "the agent's measure", status: link("10G", time.Millisecond), want: peerfetch.Link{Throughput: 625e6, RTT: time.Millisecond}},
		{name: "the operator's overrides it", spec: link("1G", 3*time.Millisecond), status: link("10G", time.Millisecond),
			want: peerfetch.Link{Throughput: 62.5e6, RTT: 3 * time.Millisecond}},
		{name: "a round trip alone", spec: link("", 2*time.Millisecond), want: peerfetch.Link{RTT: 2 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := node("mac", metav1.ConditionTrue)
			n.Spec.Link, n.Status.Link = tc.spec, tc.status
			if got := declaredLink(&n); got != tc.want {
				t.Errorf("declaredLink = %+v, want %+v", got, tc.want)
			}
		})
	}
}
