package console

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/tenancy"
)

// Strings of team B's that team A's key must never see, and of the fleet's Macs.
const (
	bSource  = "https://models.example/team-b-secret-weights.gguf"
	bDigest  = "sha256:b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0"
	bPrivate = "b-private-model"
	bReplica = "b-shared-replica-0"
	bKey     = "team-b-ci-key"
	macA     = "mac-studio-a"
	macB     = "mac-studio-ab" // mac-studio-a is a prefix of it
	aSource  = "https://models.example/team-a.gguf"
)

// twoTeams is a fleet of two Macs and two teams: team-a's own deployment, team-b's
// private one and team-b's "shared" deployment granted to team-a, with replicas,
// traffic, unloads and usage ledgers of both.
func twoTeams() Snapshot {
	dep := func(ns, name, source string, access ...string) mfv1.ModelDeployment {
		d := mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		d.Spec.Model.Source = source
		d.Spec.Replicas = ptr.To(int32(1))
		d.Status.Replicas, d.Status.ReadyReplicas = 1, 1
		d.Status.Nodes = []string{macA, macB}
		d.Status.EstimatedMemory = q("5Gi")
		if access != nil {
			d.Spec.Access = &mfv1.Access{Namespaces: access}
		}
		return d
	}
	own := dep("team-a", "qwen", aSource)
	own.Status.Conditions = []metav1.Condition{cond(mfv1.DeploymentAvailable, metav1.ConditionFalse, "Down",
		"replica qwen-0 on "+macA+" failed; "+macB+" is full")}
	private := dep("team-b", bPrivate, bSource)
	private.Status.Conditions = []metav1.Condition{cond(mfv1.DeploymentScheduled, metav1.ConditionFalse, "Unschedulable",
		"digest "+bDigest+" from "+bSource)}
	shared := dep("team-b", "shared", bSource, "team-a")
	shared.Spec.Model.ServedName = "llama"
	shared.Status.Conditions = []metav1.Condition{cond(mfv1.DeploymentAvailable, metav1.ConditionFalse, "Down", bDigest)}

	aRep := rep("team-a", "qwen-0", "qwen", macA, "2Gi", cond(mfv1.ReplicaDownloaded, metav1.ConditionTrue, "Downloaded", ""),
		cond(mfv1.ReplicaLoaded, metav1.ConditionFalse, "LoadFailed", "runner on "+macA+" exited; "+aSource))
	aRep.Status.Endpoint = "10.0.0.7:8443"
	aRep.Status.LastUnload = &mfv1.UnloadReport{Reason: "Pressure on " + macA, FreedBytes: 1 << 30, Time: metav1.NewTime(now.Add(-time.Minute))}
	bRep := rep("team-b", bReplica, "shared", macB, "3Gi", cond(mfv1.ReplicaDownloaded, metav1.ConditionFalse, "Downloading", bDigest))
	bRep.Status.Endpoint = "10.0.0.8:8443"
	bRep.Status.LastUnload = &mfv1.UnloadReport{Reason: "Idle", FreedBytes: 2 << 30, Time: metav1.NewTime(now.Add(-2 * time.Minute))}
	bRep.Spec.Template.Model.Source = bSource

	ledger := func(ns, key, deployment string, tokens int64) mfv1.TokenUsage {
		return mfv1.TokenUsage{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gw-0"}, Spec: mfv1.TokenUsageSpec{
			Gateway: "gw-0", Day: now.Format("2006-01-02"),
			Usage: []mfv1.KeyUsage{{Key: key, Deployment: deployment, Requests: 1, InputTokens: tokens, OutputTokens: tokens}}}}
	}
	return Snapshot{
		Now:         now,
		Nodes:       []mfv1.MacNode{mac(macA, metav1.ConditionTrue, time.Hour, mfv1.NodeMemoryStatus{}), mac(macB, metav1.ConditionTrue, time.Hour, mfv1.NodeMemoryStatus{})},
		Leases:      []coordinationv1.Lease{{ObjectMeta: metav1.ObjectMeta{Name: macA}}},
		Deployments: []mfv1.ModelDeployment{own, private, shared},
		Replicas:    []mfv1.ModelReplica{aRep, bRep},
		Traffic:     map[string]Traffic{"team-a/qwen": {RequestsPerSecond: 1}, "team-b/shared": {RequestsPerSecond: 7}, "team-b/" + bPrivate: {Queued: 3}},
		PromptCache: map[string]PromptCache{"team-a/qwen": {HotHits: 2}, "team-b/shared": {SSDHits: 5}, "team-b/" + bPrivate: {HotMisses: 9}},
		Usage:       []mfv1.TokenUsage{ledger("team-a", "ci", "team-b/shared", 10), ledger("team-b", bKey, "team-b/"+bPrivate, 987654)},
	}
}

var teamA = tenancy.Identity{Namespace: "team-a", Name: "ci"}

func TestScope(t *testing.T) {
	s := twoTeams()
	before, _ := json.Marshal(s)

	admin := Scope(s, tenancy.Identity{Admin: true})
	if d := cmp.Diff(s, admin, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Viewer" }, cmp.Ignore())); d != "" {
		t.Errorf("an admin sees less than everything (-all +seen):\n%s", d)
	}

	a := Scope(s, teamA)
	if after, _ := json.Marshal(s); string(after) != string(before) {
		t.Error("Scope modified the snapshot it was given")
	}
	if a.Nodes != nil || a.Leases != nil {
		t.Errorf("a team sees Macs %v or Leases %v", a.Nodes, a.Leases)
	}
	var deps []string
	for _, d := range a.Deployments {
		deps = append(deps, d.Namespace+"/"+d.Name)
	}
	if d := cmp.Diff([]string{"team-a/qwen", "team-b/shared"}, deps); d != "" {
		t.Errorf("deployments (-want +got):\n%s", d)
	}
	shared := mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "shared"}}
	shared.Spec.Model.ServedName = "llama"
	shared.Spec.Replicas = ptr.To(int32(1))
	shared.Status.Replicas, shared.Status.ReadyReplicas = 1, 1
	if d := cmp.Diff(shared, a.Deployments[1]); d != "" {
		t.Errorf("the granted deployment of team-b (-want +got):\n%s", d)
	}
	own := a.Deployments[0]
	if own.Spec.Model.Source != aSource || own.Status.Nodes != nil ||
		own.Status.Conditions[0].Message != "replica qwen-0 on a Mac failed; a Mac is full" {
		t.Errorf("team-a's own deployment: source %q, nodes %v, condition %q", own.Spec.Model.Source, own.Status.Nodes, own.Status.Conditions[0].Message)
	}
	if len(a.Replicas) != 1 || a.Replicas[0].Name != "qwen-0" || a.Replicas[0].Spec.NodeName != HiddenMac ||
		a.Replicas[0].Status.Endpoint != "" || a.Replicas[0].Status.LastUnload.Reason != "Pressure on a Mac" {
		t.Errorf("team-a's replicas: %+v", a.Replicas)
	}
	if d := cmp.Diff(map[string]Traffic{"team-a/qwen": {RequestsPerSecond: 1}}, a.Traffic); d != "" {
		t.Errorf("traffic (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]PromptCache{"team-a/qwen": {HotHits: 2}}, a.PromptCache); d != "" {
		t.Errorf("prompt cache (-want +got):\n%s", d)
	}
	if len(a.Usage) != 1 || a.Usage[0].Namespace != "team-a" {
		t.Errorf("usage: %+v", a.Usage)
	}
}

// TestTeamPagesShowNothingOfAnotherTeam builds every page a team's key may open from
// its scoped snapshot and looks for anything of team B's or of a Mac in it.
func TestTeamPagesShowNothingOfAnotherTeam(t *testing.T) {
	s := Scope(twoTeams(), teamA)
	pages := map[string]any{
		"models":     BuildModels(s),
		"unloads":    BuildUnloads(s),
		"playground": BuildPlayground(s),
		"usage":      BuildUsage(s, "team-a", 7),
	}
	forbidden := []string{bSource, bDigest, bPrivate, bReplica, bKey, macA, "10.0.0.", "987654"}
	for name, p := range pages {
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range forbidden {
			if strings.Contains(string(b), f) {
				t.Errorf("the %s page of team-a's key shows %q:\n%s", name, f, b)
			}
		}
	}
	// What it may see is there.
	models := pages["models"].(ModelsPage)
	if len(models.Deployments) != 2 || models.Deployments[0].Shared || !models.Deployments[1].Shared ||
		models.Deployments[1].Model != "team-b/shared" || models.Deployments[1].Ready != 1 || len(models.Deployments[0].Replicas) != 1 {
		t.Errorf("models page: %+v", models.Deployments)
	}
	if got := models.Deployments[0].Replicas[0]; got.Node != HiddenMac || !strings.Contains(got.Why, "runner on a Mac exited") {
		t.Errorf("team-a's replica row: %+v", got)
	}
	if d := cmp.Diff([]PlaygroundModel{{Model: "qwen", Label: "qwen (team-a)", Ready: true}, {Model: "llama", Label: "llama (team-b)", Ready: true}},
		pages["playground"].([]PlaygroundModel)); d != "" {
		t.Errorf("playground (-want +got):\n%s", d)
	}
	if u := pages["usage"].(UsagePage); len(u.Rows) != 1 || u.Total.InputTokens != 10 || u.Namespaces != nil {
		t.Errorf("usage page: %+v", u)
	}

	// The same pages for an admin show both teams: the check above can fail.
	all := Scope(twoTeams(), tenancy.Identity{Admin: true})
	b, _ := json.Marshal([]any{BuildModels(all), BuildUnloads(all), BuildUsage(all, "", 7)})
	for _, f := range []string{bDigest, bPrivate, bReplica, bKey, macA, "987654"} {
		if !strings.Contains(string(b), f) {
			t.Errorf("an admin's pages lack %q", f)
		}
	}
	if u := BuildUsage(all, "", 7); cmp.Diff([]string{"team-a", "team-b"}, u.Namespaces) != "" || u.Total.InputTokens != 987664 {
		t.Errorf("an admin's usage page: %+v", u)
	}
}

// TestScopeDeploymentsPerCaller: which deployments each caller sees, and which as
// shared (another namespace's, granted).
func TestScopeDeploymentsPerCaller(t *testing.T) {
	s := twoTeams()
	everyone := mfv1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "team-c", Name: "open"}}
	everyone.Spec.Access = &mfv1.Access{Namespaces: []string{tenancy.AllNamespaces}}
	s.Deployments = append(s.Deployments, everyone)
	tests := []struct {
		name string
		id   tenancy.Identity
		want []string // namespace/name, "(shared)" when shown as another namespace's
	}{
		{"admin", tenancy.Identity{Admin: true}, []string{"team-a/qwen", "team-b/" + bPrivate, "team-b/shared", "team-c/open"}},
		{"team-a: its own, the grant to it, the grant to all", teamA, []string{"team-a/qwen", "team-b/shared (shared)", "team-c/open (shared)"}},
		{"team-b: its own and the grant to all", tenancy.Identity{Namespace: "team-b"}, []string{"team-b/" + bPrivate, "team-b/shared", "team-c/open (shared)"}},
		{"team-d: the grant to all", tenancy.Identity{Namespace: "team-d", Name: "k"}, []string{"team-c/open (shared)"}},
		{"no namespace, not admin: nothing", tenancy.Identity{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, d := range BuildModels(Scope(s, tt.id)).Deployments {
				n := d.Model
				if d.Shared {
					n += " (shared)"
				}
				got = append(got, n)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}
