package scheduler

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// ledger remembers, per replica UID, what this scheduler wrote that its cache may not
// show yet, and when the scheduler first saw the replica.
//
// The informer cache lags the API server. Without the ledger a solve that runs right
// after a burst of bindings would see those replicas still pending and their nodes'
// memory still free: it would try to bind them again (harmless: the optimistic lock
// rejects it) and place other replicas into memory already promised (harmful: an
// over-committed Mac). Like kube-scheduler's assumed pods, a binding counts from the
// moment its write succeeded until the cache shows it. Condition writes are
// remembered the same way, so that an unchanged verdict is not written twice.
//
// Safe for concurrent use.
type ledger struct {
	mu      sync.Mutex
	entries map[types.UID]*ledgerEntry
}

type ledgerEntry struct {
	// node is the node the scheduler bound the replica to; "" once the cache shows it.
	node string
	// split is the gang the scheduler bound the replica as, with node.
	split *v1alpha1.ReplicaSplit
	// cond is the Scheduled condition the scheduler last wrote; nil once the cache
	// shows it.
	cond *metav1.Condition
	// seen is when the scheduler's informer delivered the replica's creation; zero
	// once bound, or when the replica existed before the scheduler started.
	seen time.Time
}

func (l *ledger) entry(uid types.UID) *ledgerEntry {
	if l.entries == nil {
		l.entries = make(map[types.UID]*ledgerEntry)
	}
	e := l.entries[uid]
	if e == nil {
		e = &ledgerEntry{}
		l.entries[uid] = e
	}
	return e
}

// dropIfEmpty removes uid's entry once it holds nothing. Callers hold l.mu.
func (l *ledger) dropIfEmpty(uid types.UID) {
	if e := l.entries[uid]; e != nil && e.node == "" && e.cond == nil && e.seen.IsZero() {
		delete(l.entries, uid)
	}
}

// created records when a new unbound replica was first seen.
func (l *ledger) created(uid types.UID, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entry(uid).seen = at
}

// deleted forgets a replica that is gone.
func (l *ledger) deleted(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.entries, uid)
}

// bound records a binding the API server accepted. It returns when the replica was
// first seen (zero if unknown), for the scheduling latency, and forgets that time.
func (l *ledger) bound(uid types.UID, node string) (seen time.Time) {
	return l.boundAs(uid, node, nil)
}

// boundAs is bound for a binding with its split (nil: one node).
func (l *ledger) boundAs(uid types.UID, node string, split *v1alpha1.ReplicaSplit) (seen time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entry(uid)
	seen, e.seen, e.node, e.split = e.seen, time.Time{}, node, split
	return seen
}

// wrote records a Scheduled condition the API server accepted.
func (l *ledger) wrote(uid types.UID, cond metav1.Condition) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entry(uid).cond = &cond
}

// assumedNode returns the node the scheduler bound r to while the cached r does not
// show the binding yet, else "". It also forgets whatever the cached r already shows.
func (l *ledger) assumedNode(r *v1alpha1.ModelReplica) string {
	node, _ := l.assumed(r)
	return node
}

// assumed is assumedNode with the split of an assumed gang binding.
func (l *ledger) assumed(r *v1alpha1.ModelReplica) (string, *v1alpha1.ReplicaSplit) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entries[r.UID]
	if e == nil {
		return "", nil
	}
	if r.Spec.NodeName != "" {
		e.node, e.split = "", nil
	}
	if e.cond != nil && conditionSays(meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ReplicaScheduled), *e.cond) {
		e.cond = nil
	}
	node, split := e.node, e.split
	l.dropIfEmpty(r.UID)
	return node, split
}

// condition returns r's Scheduled condition as the scheduler knows it: the one it
// last wrote if the cached r does not show it yet, else the cached one.
func (l *ledger) condition(r *v1alpha1.ModelReplica) *metav1.Condition {
	l.mu.Lock()
	if e := l.entries[r.UID]; e != nil && e.cond != nil {
		c := *e.cond
		l.mu.Unlock()
		return &c
	}
	l.mu.Unlock()
	return meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ReplicaScheduled)
}

// len is the number of replicas the ledger holds something for.
func (l *ledger) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries)
}
