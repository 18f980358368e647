package clustermode

import (
	"context"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// localPhase is where the agent is with one replica before and around the pool.
type localPhase int

const (
	phaseDownloading localPhase = iota
	phaseDownloadFailed
	phaseDownloaded
	// phaseRegistered: the pool has an entry; its state says the rest.
	phaseRegistered
	// phaseRemoving: the pool entry is being drained, unloaded and removed.
	phaseRemoving
)

// replica is the agent's local record of one replica it acts on. Every field is
// guarded by Syncer.mu.
type replica struct {
	key       string // "<namespace>/<name>", also the pool entry's name
	namespace string
	name      string
	uid       types.UID
	// hash and template are what this record was made for.
	hash       string
	template   v1alpha1.ModelReplicaTemplate
	deployment string
	// access is the replica's spec.access (its deployment's): the other namespaces
	// whose in-cluster callers may use it. It follows the replica's updates.
	access []string
	// budgeted is the replica's spec.budgetedNamespaces: the namespaces with a
	// TokenBudget whose in-cluster callers must go through the gateway.
	budgeted []string
	phase    localPhase

	// Download.
	fetchGen      int
	cancelFetch   context.CancelFunc
	path          string
	projectorPath string
	draftPath     string
	done, total   int64
	fetchErr      error
	fetchReason   string
	fetchFailures int
	retryAt       time.Time
	lastProgress  time.Time

	// loading is set while a Load goroutine of the agent runs for this entry;
	// adopting while that load is for a runner an earlier agent left.
	loading, adopting bool
	// loadErr is the last eager load's failure; the next is not before loadRetryAt.
	loadErr      error
	loadFailures int
	loadRetryAt  time.Time
	// spec is what was registered in the pool.
	spec enginepool.ModelSpec
}

// servedName is the name clients use for the replica's model.
func servedName(t v1alpha1.ModelReplicaTemplate, deployment string) string {
	if t.Model.ServedName != "" {
		return t.Model.ServedName
	}
	return deployment
}

// desiredOf classifies what the API asks of a replica. mr is nil when it is not in
// the informer's cache (deleted); local is nil when the agent has no record of it.
func desiredOf(mr *v1alpha1.ModelReplica, local *replica, node string) Desired {
	if mr == nil || mr.DeletionTimestamp != nil || mr.Spec.NodeName != node {
		return DesiredAbsent
	}
	if mr.Spec.Drain != nil {
		return DesiredDrained
	}
	if local != nil && (local.uid != mr.UID || local.hash != mr.Spec.TemplateHash) {
		return DesiredChanged
	}
	switch mr.Spec.Template.Residency {
	case v1alpha1.ResidencyPinned:
		return DesiredPinned
	case v1alpha1.ResidencyOnDemand:
		return DesiredOnDemand
	}
	return DesiredResident
}

// observedOf classifies the local state of a replica; m is its pool entry, if any.
func observedOf(local *replica, m *enginepool.ModelSnapshot) Observed {
	if local == nil {
		return ObservedNotRegistered
	}
	switch local.phase {
	case phaseDownloading:
		return ObservedDownloading
	case phaseDownloadFailed:
		return ObservedDownloadFailed
	case phaseDownloaded:
		return ObservedDownloaded
	case phaseRemoving:
		return ObservedUnloading
	}
	if m == nil {
		return ObservedDownloaded // registered, but the pool lost it: register again
	}
	switch m.State {
	case enginepool.StateLoading:
		return ObservedLoading
	case enginepool.StateReady:
		return ObservedLoaded
	case enginepool.StateDraining, enginepool.StateStopping:
		return ObservedUnloading
	case enginepool.StateFailed:
		return ObservedLoadFailed
	}
	return ObservedStandby
}

// findModel returns the pool entry named name in snap.
func findModel(snap enginepool.Snapshot, name string) *enginepool.ModelSnapshot {
	for i := range snap.Models {
		if snap.Models[i].Name == name {
			return &snap.Models[i]
		}
	}
	return nil
}

// backoff is the capped exponential delay after failures consecutive failures.
func backoff(failures int, initial, maxDelay time.Duration) time.Duration {
	d := initial
	for i := 1; i < failures && d < maxDelay; i++ {
		d *= 2
	}
	return min(d, maxDelay)
}

// statSize is the size of the file at path.
func statSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}
