package clustermode

import (
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/bytesize"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// localView is a copy of the fields of a replica record that its status shows, taken
// under the syncer's lock.
type localView struct {
	phase       localPhase
	hash        string
	done, total int64
	fetchErr    error
	fetchReason string
	retryAt     time.Time
	path        string
	loadErr     error
	loadRetryAt time.Time
}

func (r *replica) view() *localView {
	if r == nil {
		return nil
	}
	return &localView{phase: r.phase, hash: r.hash, done: r.done, total: r.total, fetchErr: r.fetchErr,
		fetchReason: r.fetchReason, retryAt: r.retryAt, path: r.path, loadErr: r.loadErr, loadRetryAt: r.loadRetryAt}
}

// ownedStatus is the agent's part of a replica's status from what it observes: the
// replica (spec), its local record, its pool entry and the agent's address. Only
// the conditions Downloaded, Loaded and Ready are set in the result; Scheduled
// belongs to the scheduler.
func ownedStatus(mr *v1alpha1.ModelReplica, local *localView, m *enginepool.ModelSnapshot, endpoint string,
	now time.Time) v1alpha1.ModelReplicaStatus {
	st := v1alpha1.ModelReplicaStatus{Endpoint: endpoint}
	if m != nil {
		st.PathsOff = pathsOff(m.Off)
		st.Vision = m.Chat != nil && m.Chat.Vision
	}
	est := mr.Spec.MemoryReservation.DeepCopy()
	st.Memory.Estimated = &est
	onDemand := mr.Spec.Template.Residency == v1alpha1.ResidencyOnDemand
	cond := func(t string, s metav1.ConditionStatus, reason, msg string) {
		st.Conditions = append(st.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg,
			ObservedGeneration: mr.Generation})
	}
	if mr.Spec.Drain != nil {
		drainStatus(&st, local, m, cond)
		if mr.Spec.Split != nil {
			// The head's own entry, with its unload for lastUnload; each worker's Mac
			// unloads its shard once this reports Drained (shardRetires).
			st.Shards = []v1alpha1.ShardStatus{shardEntry(mr.Spec.NodeName, v1alpha1.ReplicaDraining, m)}
		}
		return st
	}
	if local == nil {
		st.Phase = v1alpha1.ReplicaPending
		cond(v1alpha1.ReplicaDownloaded, metav1.ConditionFalse, v1alpha1.ReasonDownloading, "the node has not started the download yet")
		cond(v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonDownloading, "waiting for the download")
		cond(v1alpha1.ReplicaReady, metav1.ConditionFalse, v1alpha1.ReasonDownloading, "waiting for the download")
		return st
	}
	st.ObservedTemplateHash = local.hash
	if local.total > 0 || local.done > 0 {
		st.Progress = &v1alpha1.DownloadProgress{DownloadedBytes: local.done, TotalBytes: local.total}
	}
	if downloadStatus(&st, mr, local, cond) {
		return st
	}
	cond(v1alpha1.ReplicaDownloaded, metav1.ConditionTrue, v1alpha1.ReasonStored, "stored at "+local.path)
	if mr.Spec.Split != nil {
		// The head's own entry of status.shards (each worker Mac writes its own); stored,
		// the head is Loading until its runner is Ready.
		phase := v1alpha1.ReplicaLoading
		if m != nil {
			phase = shardPhase(m, nil)
		}
		st.Shards = []v1alpha1.ShardStatus{shardEntry(mr.Spec.NodeName, phase, m)}
	}
	if w := splitWaitingFor(mr); w != nil && (m == nil || m.State == enginepool.StateAbsent || m.State == enginepool.StateUnloaded) {
		st.Phase = v1alpha1.ReplicaLoading
		cond(v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonWaitingForShard, waitingMessage(w))
		cond(v1alpha1.ReplicaReady, metav1.ConditionFalse, v1alpha1.ReasonWaitingForShard, waitingMessage(w))
		return st
	}
	if m != nil {
		if r := m.LastUnload; r != nil {
			st.LastUnload = unloadReport(*r)
		}
	}
	state := enginepool.StateAbsent
	if m != nil {
		state = m.State
	}
	if local.phase == phaseRemoving {
		state = enginepool.StateDraining
	}
	engineStatus(&st, local, m, state, onDemand, now, cond)
	return st
}

// notServing holds back the Ready condition of st while the agent of node cannot
// answer requests yet (no serving certificate): a replica that would be Ready (or
// Standby) is Pending, Ready False with reason AgentNotServing; any other status
// stays as it is.
func notServing(st *v1alpha1.ModelReplicaStatus, node string) {
	c := meta.FindStatusCondition(st.Conditions, v1alpha1.ReplicaReady)
	if c == nil || c.Status != metav1.ConditionTrue {
		return
	}
	c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonAgentNotServing
	c.Message = "the agent on " + node + " has no serving certificate yet, so it answers no request: " +
		"it gets one once the manager signs its certificate request (kubectl get csr)"
	st.Phase = v1alpha1.ReplicaPending
}

// condFunc adds a condition to the status being built.
type condFunc func(t string, s metav1.ConditionStatus, reason, msg string)

// downloadStatus sets the status of a replica whose model is not stored yet (being
// downloaded, or failed to); false if it is stored.
func downloadStatus(st *v1alpha1.ModelReplicaStatus, mr *v1alpha1.ModelReplica, local *localView, cond condFunc) bool {
	switch local.phase {
	case phaseDownloading:
		st.Phase = v1alpha1.ReplicaDownloading
		msg := "downloading " + mr.Spec.Template.Model.Source + ": " + progressText(local.done, local.total)
		reason := v1alpha1.ReasonDownloading
		if local.fetchErr != nil {
			// A retry: the last failure stays the reason until an attempt succeeds.
			reason = local.fetchReason
			if reason == "" {
				reason = v1alpha1.ReasonDownloadFailed
			}
			msg = truncate(fmt.Sprintf("retrying (%s) after: %v", msg, local.fetchErr))
		}
		cond(v1alpha1.ReplicaDownloaded, metav1.ConditionFalse, reason, msg)
		cond(v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonDownloading, "waiting for the download")
		cond(v1alpha1.ReplicaReady, metav1.ConditionFalse, v1alpha1.ReasonDownloading, "waiting for the download")
		return true
	case phaseDownloadFailed:
		st.Phase = v1alpha1.ReplicaFailed
		reason := local.fetchReason
		if reason == "" {
			reason = v1alpha1.ReasonDownloadFailed
		}
		msg := fmt.Sprintf("%v; retrying at %s", local.fetchErr, local.retryAt.UTC().Format(time.RFC3339))
		cond(v1alpha1.ReplicaDownloaded, metav1.ConditionFalse, reason, truncate(msg))
		cond(v1alpha1.ReplicaLoaded, metav1.ConditionFalse, reason, "the model could not be downloaded")
		cond(v1alpha1.ReplicaReady, metav1.ConditionFalse, reason, "the model could not be downloaded")
		return true
	}
	return false
}

// engineStatus sets the status of a stored replica from its engine's state.
func engineStatus(st *v1alpha1.ModelReplicaStatus, local *localView, m *enginepool.ModelSnapshot, state enginepool.State,
	onDemand bool, now time.Time, cond condFunc) {
	switch state {
	case enginepool.StateReady:
		st.Phase = v1alpha1.ReplicaRunning
		st.Memory.Resident = quantity(m.ResidentBytes)
		st.Memory.Peak = quantity(m.PeakBytes)
		cond(v1alpha1.ReplicaLoaded, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady, loadedMessage(m))
		cond(v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonRunnerReady, "serving requests")
	case enginepool.StateLoading:
		st.Phase = v1alpha1.ReplicaLoading
		cond(v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonLoading, "a runner is loading the model")
		if onDemand {
			cond(v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonWaitingForDemand,
				"loading for the first request; requests wait for it")
		} else {
			cond(v1alpha1.ReplicaReady, metav1.ConditionFalse, v1alpha1.ReasonLoading, "a runner is loading the model")
		}
	case enginepool.StateDraining, enginepool.StateStopping:
		st.Phase = v1alpha1.ReplicaDraining
		cond(v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonDraining, "the model is being unloaded")
		if onDemand && local.phase != phaseRemoving {
			cond(v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonWaitingForDemand,
				"unloading; the next request loads the model again")
		} else {
			cond(v1alpha1.ReplicaReady, metav1.ConditionFalse, v1alpha1.ReasonDraining, "the model is being unloaded")
		}
	case enginepool.StateFailed:
		loadFailedStatus(st, m, onDemand, now, cond)
	default: // registered or about to be, not in memory
		notLoadedStatus(st, local, onDemand, cond)
	}
}

// loadFailedStatus is engineStatus of an engine that failed to load: Ready once the
// pool's backoff is over for an on-demand replica.
func loadFailedStatus(st *v1alpha1.ModelReplicaStatus, m *enginepool.ModelSnapshot, onDemand bool, now time.Time, cond condFunc) {
	msg := "the model failed to load"
	if m.LastError != "" {
		msg = m.LastError
	}
	if onDemand && !m.RetryAt.After(now) {
		// The pool's backoff is over: the next request loads the model again. Ready,
		// or no request would ever reach it (the gateway routes to Ready replicas).
		st.Phase = v1alpha1.ReplicaStandby
		cond(v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonLoadFailed, truncate(msg+"; the next request loads it again"))
		cond(v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonWaitingForDemand,
			"the model is on disk; the next request loads it (its last load failed)")
		return
	}
	st.Phase = v1alpha1.ReplicaFailed
	if !m.RetryAt.IsZero() {
		msg += "; retrying at " + m.RetryAt.UTC().Format(time.RFC3339)
	}
	cond(v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonLoadFailed, truncate(msg))
	cond(v1alpha1.ReplicaReady, metav1.ConditionFalse, v1alpha1.ReasonLoadFailed, "the model failed to load")
}

// notLoadedStatus is engineStatus of a replica registered (or about to be) and not in
// memory.
func notLoadedStatus(st *v1alpha1.ModelReplicaStatus, local *localView, onDemand bool, cond condFunc) {
	msg := "not loaded"
	if st.LastUnload != nil {
		msg = "unloaded (" + st.LastUnload.Reason + ")"
	}
	if local.loadErr != nil && !onDemand {
		st.Phase = v1alpha1.ReplicaFailed
		msg := fmt.Sprintf("%v; retrying at %s", local.loadErr, local.loadRetryAt.UTC().Format(time.RFC3339))
		cond(v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonLoadFailed, truncate(msg))
		cond(v1alpha1.ReplicaReady, metav1.ConditionFalse, v1alpha1.ReasonLoadFailed, "the model could not be loaded")
	} else if onDemand {
		st.Phase = v1alpha1.ReplicaStandby
		cond(v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonUnloaded, msg+"; the first request loads it")
		cond(v1alpha1.ReplicaReady, metav1.ConditionTrue, v1alpha1.ReasonWaitingForDemand,
			"the model is on disk; the first request loads it")
	} else {
		st.Phase = v1alpha1.ReplicaLoading
		cond(v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonUnloaded, msg+"; loading it")
		cond(v1alpha1.ReplicaReady, metav1.ConditionFalse, v1alpha1.ReasonLoading, msg+"; loading it")
	}
}

// drainStatus is the agent's status of a replica being removed (spec.drain): Loaded
// is False/Draining while its engine finishes the requests in flight and stops, then
// False/Drained — the deployment controller's signal to delete the replica — with the
// unload's report in lastUnload. It is never Ready again. cond adds a condition to st.
func drainStatus(st *v1alpha1.ModelReplicaStatus, local *localView, m *enginepool.ModelSnapshot,
	cond condFunc) {
	st.Phase = v1alpha1.ReplicaDraining
	unloading := false
	if local != nil {
		st.ObservedTemplateHash = local.hash
		unloading = local.phase == phaseRemoving
	}
	if m != nil {
		if m.LastUnload != nil {
			st.LastUnload = unloadReport(*m.LastUnload)
		}
		switch m.State {
		case enginepool.StateLoading, enginepool.StateReady, enginepool.StateDraining, enginepool.StateStopping:
			unloading = true
			st.Memory.Resident = quantity(m.ResidentBytes)
		}
	}
	if unloading {
		cond(v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonDraining,
			"finishing the requests in flight, then unloading the model: the replica is being removed")
	} else {
		msg := "not in memory: the replica is being removed"
		if st.LastUnload != nil {
			msg = fmt.Sprintf("unloaded (%s, %s freed): the replica is being removed", st.LastUnload.Reason,
				bytesize.Format(st.LastUnload.FreedBytes))
		}
		cond(v1alpha1.ReplicaLoaded, metav1.ConditionFalse, v1alpha1.ReasonDrained, msg)
	}
	cond(v1alpha1.ReplicaReady, metav1.ConditionFalse, v1alpha1.ReasonDraining,
		"the replica is being removed: requests go to the deployment's other replicas")
}

// applyOwned writes the agent's fields of owned into st, keeping the conditions of
// other writers and the transition times of conditions whose status did not change.
func applyOwned(st *v1alpha1.ModelReplicaStatus, owned v1alpha1.ModelReplicaStatus, now time.Time) {
	st.Phase = owned.Phase
	st.ObservedTemplateHash = owned.ObservedTemplateHash
	st.Progress = owned.Progress
	st.Endpoint = owned.Endpoint
	st.Memory = owned.Memory
	st.PathsOff = owned.PathsOff
	st.Vision = owned.Vision
	st.Display = &v1alpha1.MemoryDisplay{Reserved: bytesize.Quantity(owned.Memory.Estimated),
		Resident: bytesize.Quantity(owned.Memory.Resident)}
	if owned.LastUnload != nil {
		st.LastUnload = owned.LastUnload
	}
	for _, e := range owned.Shards { // the agent's own entries; the others' stay
		if i := slices.IndexFunc(st.Shards, func(s v1alpha1.ShardStatus) bool { return s.Node == e.Node }); i >= 0 {
			st.Shards[i] = e
		} else {
			st.Shards = append(st.Shards, e)
		}
	}
	for _, c := range owned.Conditions {
		c.LastTransitionTime = metav1.NewTime(now)
		meta.SetStatusCondition(&st.Conditions, c)
	}
}

// unloadReasons maps the pool's unload reasons to the ones replica status shows.
var unloadReasons = map[enginepool.UnloadReason]string{
	enginepool.ReasonAdmin:       "Admin",
	enginepool.ReasonIdle:        "Idle",
	enginepool.ReasonEviction:    "Evicted",
	enginepool.ReasonPressure:    "Pressure",
	enginepool.ReasonOverCeiling: "OverCeiling",
	enginepool.ReasonRemoved:     "Deleted",
	enginepool.ReasonShutdown:    "Shutdown",
	enginepool.ReasonCrash:       "Crashed",
	enginepool.ReasonLoadFailed:  "LoadFailed",
	enginepool.ReasonLoadAborted: "LoadAborted",
	enginepool.ReasonRetired:     "Drained",
}

// servingPaths maps the runner's paths to the ones replica status names.
var servingPaths = map[runnerapi.Path]v1alpha1.ServingPath{
	runnerapi.PathPromptCache: v1alpha1.ServingPathPromptCache,
}

// pathsOff is the replica status of the paths the runner serves the model without; a
// path the API does not name yet is left out (the agent's /api/status shows it).
func pathsOff(off []runnerapi.PathOff) []v1alpha1.PathOff {
	var out []v1alpha1.PathOff
	for _, o := range off {
		if p, ok := servingPaths[o.Path]; ok && o.Reason != "" {
			out = append(out, v1alpha1.PathOff{Path: p, Reason: truncateTo(o.Reason, maxPathOffReason)})
		}
	}
	return out
}

// maxPathOffReason bounds a path's reason (the API allows 1024 bytes).
const maxPathOffReason = 1024

func unloadReport(r enginepool.UnloadReport) *v1alpha1.UnloadReport {
	reason, ok := unloadReasons[r.Reason]
	if !ok {
		reason = string(r.Reason)
	}
	outcome := v1alpha1.UnloadOutcome(r.Outcome)
	switch r.Outcome {
	case enginepool.Settled, enginepool.Indeterminate, enginepool.TimedOut:
	default:
		outcome = v1alpha1.UnloadIndeterminate
	}
	return &v1alpha1.UnloadReport{Reason: reason, FreedBytes: max(r.FreedBytes, 0), ResidentBytes: max(r.ResidentBytes, 0),
		Outcome: outcome, Duration: metav1.Duration{Duration: r.Duration}, Time: metav1.NewTime(r.Time.Truncate(time.Second))}
}

func quantity(b int64) *resource.Quantity {
	if b <= 0 {
		return nil
	}
	return resource.NewQuantity(b, resource.BinarySI)
}

func progressText(done, total int64) string {
	if total <= 0 {
		return bytesize.Format(done) + " so far"
	}
	return fmt.Sprintf("%s of %s (%d%%)", bytesize.Format(done), bytesize.Format(total), done*100/total)
}

// maxMessage bounds condition messages (the API allows 32768 bytes).
const maxMessage = 4096

func truncate(s string) string { return truncateTo(s, maxMessage) }

// truncateTo cuts s to at most n bytes, marking the cut.
func truncateTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// loadedMessage is the Loaded=True message of a ready engine: its runner and, when
// the model's own chat template was refused at load (it does not parse, or nests
// beyond the template limits), that prompts are rendered with llama.cpp's built-in
// templates instead.
func loadedMessage(m *enginepool.ModelSnapshot) string {
	msg := fmt.Sprintf("runner pid %d holds the model (%s resident)", m.PID, bytesize.Format(m.ResidentBytes))
	if m.Chat != nil && m.Chat.TemplateError != "" {
		msg = truncate(msg + "; the model's chat template is not used (" + m.Chat.TemplateError +
			"): prompts are rendered with llama.cpp's built-in templates")
	}
	return msg
}
