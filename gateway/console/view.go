// Package console is the gateway's web console at /ui: server-rendered pages of the
// fleet (one row per Mac with its memory bar), the model deployments and their
// replicas, the recent unloads with the bytes they freed, and a chat playground.
//
// The pages are built in two steps. The view functions in this file are pure: a
// Snapshot of the objects the gateway's informers already hold goes in, the data a
// template renders comes out, so every number on a page is table-tested without a
// server. server.go wires them to HTTP: authentication by the gateway's API keys,
// html/template rendering, a Content-Security-Policy, and the playground's pass-through
// to the public /v1/chat/completions API.
package console

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"

	"github.com/macfleet/macfleet/gateway/tenancy"
	"github.com/macfleet/macfleet/internal/bytesize"
	"github.com/macfleet/macfleet/internal/ceiling"
)

// Snapshot is what a page is built from: the objects in the gateway's informer cache
// and the time the page is rendered at.
type Snapshot struct {
	Nodes []mfv1.MacNode
	// Leases are the agents' node Leases (macfleet-node-lease), named like their
	// MacNodes; nil when they could not be read (the page then shows no lease age).
	Leases      []coordinationv1.Lease
	Deployments []mfv1.ModelDeployment
	Replicas    []mfv1.ModelReplica
	// Traffic is each deployment's recent traffic through this gateway, by
	// "<namespace>/<name>"; a deployment without an entry had none.
	Traffic map[string]Traffic
	// PromptCache is each deployment's prompt cache counters by "<namespace>/<name>";
	// a deployment without an entry has none reported.
	PromptCache map[string]PromptCache
	// Usage is the gateways' TokenUsage ledgers (read for the usage page only).
	Usage []mfv1.TokenUsage
	Now   time.Time
	// Viewer is whom the pages are built for (set by Scope): a team's key sees
	// another namespace's granted deployment as shared.
	Viewer tenancy.Identity
}

// Traffic is a deployment's recent requests through the gateway serving the console.
type Traffic struct {
	RequestsPerSecond float64
	TTFTp50, TTFTp99  time.Duration
	// TTFTSamples is how many requests the percentiles come from (0: none recently).
	TTFTSamples      int
	InFlight, Queued int
}

// TrafficRow is Traffic as the models page prints it.
type TrafficRow struct {
	Rate, TTFT, Load string
	// Queued is the number waiting in the fair queue (tests and the page's class).
	Queued int
}

func trafficRow(t Traffic) TrafficRow {
	row := TrafficRow{Rate: fmt.Sprintf("%.1f req/s", t.RequestsPerSecond), TTFT: "TTFT —",
		Load: fmt.Sprintf("%d in flight, %d queued", t.InFlight, t.Queued), Queued: t.Queued}
	if t.TTFTSamples > 0 {
		n := fmt.Sprintf("%d requests", t.TTFTSamples)
		if t.TTFTSamples == 1 {
			n = "1 request"
		}
		row.TTFT = fmt.Sprintf("TTFT p50 %s, p99 %s (%s)", millis(t.TTFTp50), millis(t.TTFTp99), n)
	}
	return row
}

// millis prints a duration in milliseconds, or seconds from 10 s.
func millis(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%d ms", d.Milliseconds())
}

// MaxUnloads bounds the unloads table.
const MaxUnloads = 50

// Bytes is a byte count with its human form; N is what tests and the browser compare.
type Bytes struct {
	N    int64
	Text string
}

func bytesOf(n int64) Bytes { return Bytes{N: n, Text: bytesize.Format(n)} }

func quantity(q *resource.Quantity) int64 {
	if q == nil {
		return 0
	}
	return q.Value()
}

// Age prints a duration the way kubectl does: 45s, 12m, 3h, 2d; "" for a zero time.
func Age(now time.Time, t metav1.Time) string {
	if t.IsZero() {
		return ""
	}
	d := now.Sub(t.Time)
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	default:
		return fmt.Sprintf("%dd", int(d.Hours()/24))
	}
}

// Segment is one coloured part of a memory bar.
type Segment struct {
	Label string
	Bytes Bytes
	// Offset and Percent place it on the bar, in percent of the scale (0.1 steps).
	Offset, Percent float64
	// Class picks the colour: "model" (resident bytes of one replica), "other" (used
	// by everything else on the Mac, the agent among it).
	Class string
}

// Marker is a vertical line on a memory bar.
type Marker struct {
	Label   string
	Bytes   Bytes
	Percent float64
	Class   string // "soft", "hard", "committed"
}

// Bar is a Mac's memory: used memory split into segments against the ceiling, with
// the watermarks and the committed reservations as markers.
type Bar struct {
	Scale    Bytes
	Segments []Segment
	Markers  []Marker
	// Summary is the bar in words, for screen readers and for the page without colour.
	Summary string
}

// NodeRow is one Mac on the fleet page.
type NodeRow struct {
	Name, Chip, AgentVersion string
	// Ready is the Ready condition's status (True, False, Unknown) and ReadyReason its
	// reason; ReadyFor how long it has held. LeaseAge is how long ago the agent last
	// renewed its Lease ("" when unknown): a live agent renews every few seconds.
	Ready, ReadyReason, ReadyFor string
	LeaseAge                     string
	Unschedulable                bool
	Unified, Ceiling, Used       Bytes
	Committed, Soft, Hard        Bytes
	// Ceiling is what the scheduler places replicas by (internal/ceiling.Node); when
	// the agent reports more, Reported is its report and CappedBy the bound that
	// capped it (Operator: spec.memoryCeiling, Measured: the memory the agent
	// measured, Chip: the chip's memory).
	Reported  Bytes
	CappedBy  string
	Pressure  string
	Evictions int64
	Freed     Bytes
	Models    int
	Bar       Bar
}

// FleetPage is the fleet overview.
type FleetPage struct {
	Nodes                []NodeRow
	Ready                int
	Ceiling, Used, Freed Bytes
	Evictions            int64
}

func percent(n, scale int64) float64 {
	if scale <= 0 || n <= 0 {
		return 0
	}
	p := float64(n) * 100 / float64(scale)
	if p > 100 {
		p = 100
	}
	return float64(int64(p*10+0.5)) / 10
}

// BuildFleet is the fleet page: Macs sorted by name, each model's resident bytes
// taken from the ready replicas bound to it.
func BuildFleet(s Snapshot) FleetPage {
	byNode := map[string][]mfv1.ModelReplica{}
	for _, r := range s.Replicas {
		if r.Spec.NodeName != "" {
			byNode[r.Spec.NodeName] = append(byNode[r.Spec.NodeName], r)
		}
	}
	renewed := map[string]metav1.Time{}
	for _, l := range s.Leases {
		if l.Spec.RenewTime != nil {
			renewed[l.Name] = metav1.Time{Time: l.Spec.RenewTime.Time}
		}
	}
	var p FleetPage
	var ceiling, used, freed int64
	for _, n := range s.Nodes {
		row := nodeRow(n, byNode[n.Name], s.Now)
		if t, ok := renewed[n.Name]; ok {
			row.LeaseAge = Age(s.Now, t)
		}
		if row.Ready == string(metav1.ConditionTrue) {
			p.Ready++
		}
		ceiling += row.Ceiling.N
		used += row.Used.N
		freed += row.Freed.N
		p.Evictions += row.Evictions
		p.Nodes = append(p.Nodes, row)
	}
	slices.SortFunc(p.Nodes, func(a, b NodeRow) int { return cmp.Compare(a.Name, b.Name) })
	p.Ceiling, p.Used, p.Freed = bytesOf(ceiling), bytesOf(used), bytesOf(freed)
	return p
}

func nodeRow(n mfv1.MacNode, replicas []mfv1.ModelReplica, now time.Time) NodeRow {
	m := n.Status.Memory
	row := NodeRow{
		Name: n.Name, Chip: n.Status.Hardware.Chip, AgentVersion: n.Status.Agent.Version,
		Ready: "Unknown", Unschedulable: n.Spec.Unschedulable,
		Unified: bytesOf(quantity(n.Status.Hardware.UnifiedMemory)),
		Ceiling: bytesOf(quantity(m.Ceiling)), Reported: bytesOf(quantity(m.Ceiling)), Used: bytesOf(quantity(m.Used)),
		Committed: bytesOf(quantity(m.Committed)),
		Soft:      bytesOf(quantity(m.SoftWatermark)), Hard: bytesOf(quantity(m.HardWatermark)),
		Pressure: string(m.Pressure), Evictions: m.Evictions, Freed: bytesOf(m.FreedBytesTotal),
	}
	if c, ok := ceiling.Node(&n); ok && c.Source != ceiling.SourceReported {
		row.Ceiling, row.CappedBy = bytesOf(c.Bytes), string(c.Source)
	}
	if c := meta.FindStatusCondition(n.Status.Conditions, mfv1.MacNodeReady); c != nil {
		row.Ready, row.ReadyReason, row.ReadyFor = string(c.Status), c.Reason, Age(now, c.LastTransitionTime)
	}
	row.Bar = nodeBar(row, replicas)
	for _, r := range replicas {
		if quantity(r.Status.Memory.Resident) > 0 {
			row.Models++
		}
	}
	return row
}

func nodeBar(row NodeRow, replicas []mfv1.ModelReplica) Bar {
	scale := max(row.Ceiling.N, row.Used.N, row.Committed.N)
	b := Bar{Scale: bytesOf(scale)}
	slices.SortFunc(replicas, func(a, b mfv1.ModelReplica) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	var resident int64
	for _, r := range replicas {
		n := quantity(r.Status.Memory.Resident)
		if n <= 0 {
			continue
		}
		resident += n
		b.Segments = append(b.Segments, Segment{Label: modelOf(r), Bytes: bytesOf(n), Percent: percent(n, scale), Class: "model"})
	}
	if other := row.Used.N - resident; other > 0 {
		b.Segments = append(b.Segments, Segment{Label: "other (agent, system)", Bytes: bytesOf(other),
			Percent: percent(other, scale), Class: "other"})
	}
	var at int64
	for i := range b.Segments {
		b.Segments[i].Offset = percent(at, scale)
		at += b.Segments[i].Bytes.N
	}
	for _, m := range []Marker{
		{Label: "committed reservations", Bytes: row.Committed, Class: "committed"},
		{Label: "soft watermark", Bytes: row.Soft, Class: "soft"},
		{Label: "hard watermark", Bytes: row.Hard, Class: "hard"},
	} {
		if m.Bytes.N > 0 {
			m.Percent = percent(m.Bytes.N, scale)
			b.Markers = append(b.Markers, m)
		}
	}
	parts := []string{fmt.Sprintf("%s used of %s ceiling", row.Used.Text, row.Ceiling.Text)}
	if row.CappedBy != "" {
		parts[0] += fmt.Sprintf(" (the Mac reports %s, capped by %s)", row.Reported.Text, cappedBy(row.CappedBy))
	}
	for _, s := range b.Segments {
		parts = append(parts, s.Label+" "+s.Bytes.Text)
	}
	for _, m := range b.Markers {
		parts = append(parts, m.Label+" "+m.Bytes.Text)
	}
	b.Summary = strings.Join(parts, "; ")
	return b
}

// cappedBy names the bound that capped a Mac's ceiling for people.
func cappedBy(source string) string {
	switch source {
	case string(ceiling.SourceOperator):
		return "spec.memoryCeiling"
	case string(ceiling.SourceMeasured):
		return "the memory it measured"
	}
	return "the chip's memory"
}

// modelOf names a replica's model: its deployment's served name when the template
// sets one, else the deployment (from the label), else the replica.
func modelOf(r mfv1.ModelReplica) string {
	if s := r.Spec.Template.Model.ServedName; s != "" {
		return s
	}
	if d := r.Labels[mfv1.LabelDeployment]; d != "" {
		return d
	}
	return r.Name
}

// ReplicaRow is one replica of a deployment.
type ReplicaRow struct {
	Name, Node, Phase string
	Ready             bool
	Estimated         Bytes
	Resident, Peak    Bytes
	Reservation       Bytes
	// Progress is the download's percentage while one runs, else "".
	Progress string
	// Why is the reason it is not ready yet (a condition's message), "" when ready.
	Why string
}

// DeploymentRow is one ModelDeployment with its replicas.
type DeploymentRow struct {
	Namespace, Name, Served string
	// Model is what a client puts in "model" to reach it: "<namespace>/<name>" always
	// routes, whatever other deployments serve.
	Model               string
	Residency           string
	Desired, Ready      int32
	Estimated, Measured Bytes
	// Problems are the deployment's conditions that say something is wrong
	// (Scheduled=False, Available=False, ReplicaFailure=True), as "Type: message".
	Problems []string
	// Shared: another namespace's deployment granted to the viewer's; the page shows
	// only its name and readiness (Scope removed the rest).
	Shared bool
	// Traffic is its recent requests through this gateway.
	Traffic TrafficRow
	// PromptCache is its prompt cache's hit rate by tier; nil when none was reported.
	PromptCache *PromptCacheRow
	Replicas    []ReplicaRow
}

// ModelsPage lists the deployments.
type ModelsPage struct {
	Deployments []DeploymentRow
}

// BuildModels is the models page: deployments by namespace and name, their replicas
// by name.
func BuildModels(s Snapshot) ModelsPage {
	type key struct{ ns, name string }
	reps := map[key][]mfv1.ModelReplica{}
	for _, r := range s.Replicas {
		k := key{r.Namespace, r.Labels[mfv1.LabelDeployment]}
		reps[k] = append(reps[k], r)
	}
	var p ModelsPage
	for _, d := range s.Deployments {
		row := DeploymentRow{
			Namespace: d.Namespace, Name: d.Name, Served: cmp.Or(d.Spec.Model.ServedName, d.Name),
			Model: d.Namespace + "/" + d.Name, Residency: string(d.Spec.Residency),
			Desired: d.Status.Replicas, Ready: d.Status.ReadyReplicas,
			Estimated: bytesOf(quantity(d.Status.EstimatedMemory)), Measured: bytesOf(quantity(d.Status.MeasuredMemory)),
		}
		if d.Spec.Replicas != nil {
			row.Desired = *d.Spec.Replicas
		}
		row.Shared = s.Viewer.Namespace != "" && !s.Viewer.Admin && d.Namespace != s.Viewer.Namespace
		row.Problems = deploymentProblems(d.Status.Conditions)
		row.Traffic = trafficRow(s.Traffic[row.Model])
		if pc, ok := s.PromptCache[row.Model]; ok {
			r := promptCacheRow(pc)
			row.PromptCache = &r
		}
		scheduled := meta.FindStatusCondition(d.Status.Conditions, mfv1.DeploymentScheduled)
		for _, r := range reps[key{d.Namespace, d.Name}] {
			row.Replicas = append(row.Replicas, replicaRow(r, scheduled))
		}
		slices.SortFunc(row.Replicas, func(a, b ReplicaRow) int { return cmp.Compare(a.Name, b.Name) })
		p.Deployments = append(p.Deployments, row)
	}
	slices.SortFunc(p.Deployments, func(a, b DeploymentRow) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return p
}

func deploymentProblems(conds []metav1.Condition) []string {
	var out []string
	for _, c := range conds {
		bad := c.Status == metav1.ConditionFalse
		if c.Type == mfv1.DeploymentReplicaFailure {
			bad = c.Status == metav1.ConditionTrue
		}
		if c.Type == mfv1.DeploymentProgressing || !bad {
			continue
		}
		out = append(out, c.Type+": "+cmp.Or(c.Message, c.Reason))
	}
	slices.Sort(out)
	return out
}

// replicaRow explains a replica; scheduled is its deployment's Scheduled condition,
// which carries the solver's reason for replicas that have no Mac yet.
func replicaRow(r mfv1.ModelReplica, scheduled *metav1.Condition) ReplicaRow {
	row := ReplicaRow{
		Name: r.Name, Node: r.Spec.NodeName, Phase: string(r.Status.Phase),
		Estimated:   bytesOf(quantity(r.Status.Memory.Estimated)),
		Resident:    bytesOf(quantity(r.Status.Memory.Resident)),
		Peak:        bytesOf(quantity(r.Status.Memory.Peak)),
		Reservation: bytesOf(r.Spec.MemoryReservation.Value()),
	}
	if row.Phase == "" {
		row.Phase = string(mfv1.ReplicaPending)
	}
	row.Ready = meta.IsStatusConditionTrue(r.Status.Conditions, mfv1.ReplicaReady)
	if p := r.Status.Progress; p != nil && p.TotalBytes > 0 && p.DownloadedBytes < p.TotalBytes {
		row.Progress = fmt.Sprintf("%.0f%%", float64(p.DownloadedBytes)*100/float64(p.TotalBytes))
	}
	if r.Spec.Drain != nil {
		// Removed by its deployment; the agent may not have written its phase yet.
		row.Phase, row.Ready = string(mfv1.ReplicaDraining), false
	}
	switch {
	case r.Spec.Drain != nil:
		row.Why = "being removed: its requests finish and its model is unloaded, then it is deleted"
		if c := meta.FindStatusCondition(r.Status.Conditions, mfv1.ReplicaLoaded); c != nil && c.Reason == mfv1.ReasonDrained {
			row.Why = "being removed: " + cmp.Or(c.Message, c.Reason)
		}
	case row.Ready:
	case r.Spec.NodeName == "":
		row.Why = "not placed on a Mac yet"
		if scheduled != nil && scheduled.Status == metav1.ConditionFalse {
			row.Why = "not placed: " + cmp.Or(scheduled.Message, scheduled.Reason)
		}
	default:
		// The first condition of the load sequence that is not True says where it stands.
		for _, t := range []string{mfv1.ReplicaDownloaded, mfv1.ReplicaLoaded, mfv1.ReplicaReady} {
			c := meta.FindStatusCondition(r.Status.Conditions, t)
			if c == nil {
				row.Why = "waiting for the agent on " + r.Spec.NodeName + " (" + t + " not reported)"
				break
			}
			if c.Status != metav1.ConditionTrue {
				row.Why = t + ": " + cmp.Or(c.Message, c.Reason)
				break
			}
		}
	}
	return row
}

// PlaygroundModel is one choice in the playground.
type PlaygroundModel struct {
	Model, Label string
	Ready        bool
}

// BuildPlayground lists the deployments a chat can go to, ready ones first: by served
// name where only one deployment serves it, else as "<namespace>/<name>".
func BuildPlayground(s Snapshot) []PlaygroundModel {
	deps := BuildModels(s).Deployments
	served := map[string]int{}
	for _, d := range deps {
		served[d.Served]++
	}
	var out []PlaygroundModel
	for _, d := range deps {
		label := d.Served + " (" + d.Namespace + ")"
		if d.Ready == 0 {
			label += " — no ready replica"
		}
		m := d.Served
		if served[m] > 1 {
			m = d.Model
		}
		out = append(out, PlaygroundModel{Model: m, Label: label, Ready: d.Ready > 0})
	}
	slices.SortStableFunc(out, func(a, b PlaygroundModel) int {
		if a.Ready == b.Ready {
			return 0
		}
		if a.Ready {
			return -1
		}
		return 1
	})
	return out
}
