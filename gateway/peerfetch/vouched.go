package peerfetch

import "sync"

// Vouched bounds.
const (
	// DefaultVouchedPerReplica bounds the prefixes recorded per replica: past it the
	// older half is forgotten (two generations), and a state of a forgotten prefix is
	// no longer fetched from that replica.
	DefaultVouchedPerReplica = 8192
	// defaultVouchedReplicas bounds the replicas recorded; past it the record starts
	// over.
	defaultVouchedReplicas = 4096
)

// Vouched records, per replica, the prefix digests (with their cache partition) that
// the gateway sent it — in a request routed to it, or with a ticket to fetch the state
// from another replica — and so that it may serve to its peers. A replica's prefix
// events are its Mac's claim; a state is fetched from a replica only for a prefix
// recorded here, so that a compromised Mac cannot offer a state (forged KV) for a
// prefix it was never sent: say a guessed system prompt of a partition it never
// served. It is safe for concurrent use.
type Vouched struct {
	perReplica int

	mu        sync.Mutex
	byReplica map[string]*vouchedSet
}

type vouchKey struct{ partition, digest string }

// vouchedSet holds two generations: cur fills up to half the bound, then becomes old.
type vouchedSet struct {
	cur, old map[vouchKey]struct{}
}

// NewVouched is an empty record (DefaultVouchedPerReplica where perReplica ≤ 0).
func NewVouched(perReplica int) *Vouched {
	if perReplica <= 0 {
		perReplica = DefaultVouchedPerReplica
	}
	return &Vouched{perReplica: perReplica, byReplica: map[string]*vouchedSet{}}
}

// Vouch records that replica was sent the prefixes digests of partition.
func (v *Vouched) Vouch(replica, partition string, digests ...string) {
	if len(digests) == 0 {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.byReplica[replica]
	if s == nil {
		if len(v.byReplica) >= defaultVouchedReplicas {
			clear(v.byReplica)
		}
		s = &vouchedSet{cur: map[vouchKey]struct{}{}}
		v.byReplica[replica] = s
	}
	for _, d := range digests {
		k := vouchKey{partition, d}
		if _, ok := s.cur[k]; ok {
			continue
		}
		if len(s.cur) >= max(v.perReplica/2, 1) {
			s.old, s.cur = s.cur, map[vouchKey]struct{}{}
		}
		s.cur[k] = struct{}{}
	}
}

// Depth is how many of digests (a chain, shallowest first) replica may serve in
// partition: the position of the deepest one recorded for it, 0 for none.
func (v *Vouched) Depth(replica, partition string, digests []string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.byReplica[replica]
	if s == nil {
		return 0
	}
	for i := len(digests) - 1; i >= 0; i-- {
		k := vouchKey{partition, digests[i]}
		if _, ok := s.cur[k]; ok {
			return i + 1
		}
		if _, ok := s.old[k]; ok {
			return i + 1
		}
	}
	return 0
}

// Forget drops what replica was sent (it left the routing table).
func (v *Vouched) Forget(replica string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.byReplica, replica)
}
