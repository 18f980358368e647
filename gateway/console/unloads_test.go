package console

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

// splitReplica is a replica split over three Macs (layers 0–9, 10–19, 20–31) whose
// head and first worker have reported their unloads and whose last worker has not; its
// status lists the shards out of shard order, as each Mac's agent adds its own entry.
func splitReplica(ns string) mfv1.ModelReplica {
	r := rep(ns, "big-0", "big", "mac-head", "")
	r.Spec.Split = &mfv1.ReplicaSplit{Macs: "mac-head,mac-w1,mac-w2", Layers: "0-9,10-19,20-31", Shards: []mfv1.ReplicaShard{
		{Node: "mac-head", FirstLayer: 0, LastLayer: 9, Memory: resource.MustParse("2Gi")},
		{Node: "mac-w1", FirstLayer: 10, LastLayer: 19, Memory: resource.MustParse("2Gi")},
		{Node: "mac-w2", FirstLayer: 20, LastLayer: 31, Memory: resource.MustParse("3Gi")},
	}}
	report := func(freed int64, outcome mfv1.UnloadOutcome, ago time.Duration) *mfv1.UnloadReport {
		return &mfv1.UnloadReport{Reason: "Deleted", FreedBytes: freed, ResidentBytes: freed + 1<<20, Outcome: outcome,
			Duration: metav1.Duration{Duration: 250 * time.Millisecond}, Time: metav1.NewTime(now.Add(-ago))}
	}
	r.Status.LastUnload = report(3<<30, mfv1.UnloadSettled, 2*time.Minute)
	r.Status.Shards = []mfv1.ShardStatus{
		{Node: "mac-w2"},
		{Node: "mac-w1", LastUnload: report(1<<30, mfv1.UnloadTimedOut, time.Minute)},
		{Node: "mac-head", LastUnload: report(3<<30, mfv1.UnloadSettled, 2*time.Minute)},
	}
	return r
}

// TestBuildUnloadsSplitReplica: a split replica's row lists each shard in shard order
// with its Mac, layers and what that Mac reported (or that it has not), and the page's
// total counts each Mac's freed bytes once; a replica on one Mac has no shard rows.
func TestBuildUnloadsSplitReplica(t *testing.T) {
	one := rep("a", "small-0", "small", "mac-x", "")
	one.Status.LastUnload = &mfv1.UnloadReport{Reason: "Idle", FreedBytes: 1 << 20, Time: metav1.NewTime(now.Add(-time.Hour))}
	p := BuildUnloads(Snapshot{Now: now, Replicas: []mfv1.ModelReplica{one, splitReplica("a")}})
	if len(p.Unloads) != 2 || p.Unloads[0].Replica != "big-0" || p.Unloads[1].Shards != nil {
		t.Fatalf("unloads %+v: want the split replica first and no shards for the one on one Mac", p.Unloads)
	}
	type shard struct {
		Index                 int
		Node, Layers, Outcome string
		Reported              bool
		Freed                 int64
		FreedText, Took, When string
	}
	var got []shard
	for _, s := range p.Unloads[0].Shards {
		when := ""
		if !s.Time.IsZero() {
			when = s.Time.Format(time.RFC3339)
		}
		got = append(got, shard{s.Index, s.Node, s.Layers, s.Outcome, s.Reported, s.Freed.N, s.Freed.Text, s.Duration, when})
	}
	want := []shard{
		{0, "mac-head", "0–9", string(mfv1.UnloadSettled), true, 3 << 30, "3.0 GiB", "250ms", now.Add(-2 * time.Minute).Format(time.RFC3339)},
		{1, "mac-w1", "10–19", string(mfv1.UnloadTimedOut), true, 1 << 30, "1.0 GiB", "250ms", now.Add(-time.Minute).Format(time.RFC3339)},
		{2, "mac-w2", "20–31", "", false, 0, "", "", ""},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("shards (-want +got):\n%s", d)
	}
	// The head's entry repeats the replica's unload: 3 GiB (head) + 1 GiB (worker 1) +
	// 1 MiB (the other replica).
	if want := int64(4<<30 + 1<<20); p.Freed.N != want {
		t.Errorf("freed = %d, want %d", p.Freed.N, want)
	}
}

// TestTeamSeesSplitShardsWithoutMacs: a team's key sees its split replica's shards on
// the unloads page, each with its own layers and freed bytes, but no Mac's name.
func TestTeamSeesSplitShardsWithoutMacs(t *testing.T) {
	r := splitReplica("team-a")
	r.Status.Shards[1].LastUnload.Reason = "Pressure on mac-w1"
	all := Snapshot{Now: now, Replicas: []mfv1.ModelReplica{r}}
	p := BuildUnloads(Scope(all, teamA))
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"mac-head", "mac-w1", "mac-w2"} {
		if strings.Contains(string(b), m) {
			t.Errorf("team-a's unloads page shows %q:\n%s", m, b)
		}
	}
	if len(p.Unloads) != 1 || len(p.Unloads[0].Shards) != 3 {
		t.Fatalf("team-a's unloads %+v: want its split replica with three shards", p.Unloads)
	}
	var got []string
	for _, s := range p.Unloads[0].Shards {
		got = append(got, s.Node+" "+s.Layers+" "+s.Freed.Text+" "+s.Reason)
	}
	want := []string{"a Mac 0–9 3.0 GiB Deleted", "a Mac 10–19 1.0 GiB Pressure on a Mac", "a Mac 20–31  "}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("team-a's shards (-want +got):\n%s", d)
	}
	// Scope copies what it hides: the snapshot keeps the Macs.
	if r.Spec.Split.Shards[0].Node != "mac-head" || r.Status.Shards[0].Node != "mac-w2" {
		t.Errorf("Scope modified the snapshot's replica: %+v %+v", r.Spec.Split.Shards, r.Status.Shards)
	}
}

// TestUnloadsPageShowsShards: the unloads page renders a split replica's shard rows:
// each Mac, its layers, its freed bytes and outcome, and the shard not reported yet.
func TestUnloadsPageShowsShards(t *testing.T) {
	srv, _ := serve(t, keys, fixed(Snapshot{Now: now, Replicas: []mfv1.ModelReplica{splitReplica("a")}}))
	resp, body := do(t, noRedirect(nil), "GET", srv.URL+"/ui/unloads", nil, map[string]string{"Authorization": "Bearer " + testKey})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /ui/unloads: %d", resp.StatusCode)
	}
	for _, w := range []string{`data-shard="0"`, `data-shard="1"`, `data-shard="2"`, "layers 10–19", "<td>mac-w1</td>",
		`data-bytes="1073741824">1.0 GiB`, ">" + string(mfv1.UnloadTimedOut) + "<", "<td>mac-w2</td>", "not reported yet", "4.0 GiB freed"} {
		if !strings.Contains(body, w) {
			t.Errorf("the unloads page lacks %q:\n%s", w, body)
		}
	}
}
