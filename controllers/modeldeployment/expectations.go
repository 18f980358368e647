package modeldeployment

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

// expectationsTimeout is how long the controller waits for its cache to show a
// create or delete it made before it stops waiting (a lost watch event must not
// wedge a deployment).
const expectationsTimeout = 5 * time.Minute

// expectations remembers the replicas a pass created and deleted until the cache
// shows them, so that the next pass does not act on a stale list (create a second
// replica for the same gap, or delete one twice).
type expectations struct {
	mu sync.Mutex
	m  map[types.UID]*expected
}

type expected struct {
	adds, dels sets.Set[string]
	since      time.Time
}

// expect records creations and deletions made for a deployment at now.
func (e *expectations) expect(uid types.UID, now time.Time, added, deleted []string) {
	if len(added) == 0 && len(deleted) == 0 {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m == nil {
		e.m = make(map[types.UID]*expected)
	}
	// Entries of deployments deleted while they waited are swept here.
	for k, x := range e.m {
		if now.Sub(x.since) > expectationsTimeout {
			delete(e.m, k)
		}
	}
	x, ok := e.m[uid]
	if !ok {
		x = &expected{adds: sets.New[string](), dels: sets.New[string]()}
		e.m[uid] = x
	}
	x.adds.Insert(added...)
	x.dels.Insert(deleted...)
	x.since = now
}

// satisfied reports whether the cache shows every recorded creation (the name is
// listed) and deletion (the name is not live: absent or being deleted), forgetting
// those it shows. Expectations older than expectationsTimeout are dropped.
func (e *expectations) satisfied(uid types.UID, now time.Time, listed, live sets.Set[string]) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.m[uid]
	if !ok {
		return true
	}
	for n := range x.adds {
		if listed.Has(n) {
			x.adds.Delete(n)
		}
	}
	for n := range x.dels {
		if !live.Has(n) {
			x.dels.Delete(n)
		}
	}
	if x.adds.Len() == 0 && x.dels.Len() == 0 || now.Sub(x.since) > expectationsTimeout {
		delete(e.m, uid)
		return true
	}
	return false
}
