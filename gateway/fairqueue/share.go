package fairqueue

import "time"

// DefaultActiveWindow is how long a client counts as active after its last request
// arrived: about the pause of a person between two turns of a chat, or of an agent
// between two steps, so such a client finds its slot kept when it comes back. The price
// is that a client alone holds one slot fewer for that long after another client's last
// request.
const DefaultActiveWindow = 30 * time.Second

// Share keeps room for other clients on a deployment: while more than one client is
// active, no client may hold more than capacity − Reserve of the deployment's
// sequence slots, so a client that arrives while another one keeps every slot busy
// finds a slot free at once instead of waiting for one of the other client's requests
// to end. The round robin of the Queue decides the order of the waiting requests;
// Share decides only how many one client may hold at once. A client alone may hold
// every slot, so a single client loses no throughput.
//
// A client is active while it holds a slot, or for ActiveWindow after its last
// request arrived. Like Queue it has no clock and no lock of its own: the caller
// passes the time and holds its lock.
type Share struct {
	// Reserve is how many slots a client leaves to the others (0: none).
	Reserve int
	// ActiveWindow: see DefaultActiveWindow.
	ActiveWindow time.Duration

	flows map[string]*shareFlow
}

type shareFlow struct {
	held    int
	arrived time.Time
}

// NewShare is a Share keeping reserve slots (a negative reserve is 0) with the
// DefaultActiveWindow when window ≤ 0.
func NewShare(reserve int, window time.Duration) *Share {
	if window <= 0 {
		window = DefaultActiveWindow
	}
	return &Share{Reserve: max(reserve, 0), ActiveWindow: window, flows: map[string]*shareFlow{}}
}

// Arrive records that a request of the flow arrived at now.
func (s *Share) Arrive(flow string, now time.Time) {
	s.flow(flow).arrived = now
}

// Allows is whether the flow may take width more slots (a request for n choices takes
// n) of a deployment with capacity slots in all at now. A request wider than the
// flow's cap counts as the cap, so it is not held back for ever: it runs once the flow
// holds nothing.
func (s *Share) Allows(flow string, width, capacity int, now time.Time) bool {
	f := s.flows[flow]
	held := 0
	if f != nil {
		held = f.held
	}
	limit := s.Cap(flow, capacity, now)
	return held+min(max(width, 1), limit) <= limit
}

// Cap is how many slots the flow may hold at now: capacity, less Reserve while
// another flow is active, and never less than one.
func (s *Share) Cap(flow string, capacity int, now time.Time) int {
	if s.Reserve == 0 || capacity <= 1 || !s.othersActive(flow, now) {
		return capacity
	}
	return max(capacity-s.Reserve, 1)
}

// Grant records that the flow took n slots.
func (s *Share) Grant(flow string, n int) { s.flow(flow).held += max(n, 0) }

// Done records that the flow gave n slots back.
func (s *Share) Done(flow string, n int) {
	if f := s.flows[flow]; f != nil {
		f.held = max(f.held-max(n, 0), 0)
	}
}

// Forget drops the flows that are no longer active at now, so a deployment's Share
// does not grow with every client it has ever served.
func (s *Share) Forget(now time.Time) {
	for k, f := range s.flows {
		if !s.active(f, now) {
			delete(s.flows, k)
		}
	}
}

// Len is how many flows the Share remembers.
func (s *Share) Len() int { return len(s.flows) }

func (s *Share) othersActive(flow string, now time.Time) bool {
	for k, f := range s.flows {
		if k != flow && s.active(f, now) {
			return true
		}
	}
	return false
}

func (s *Share) active(f *shareFlow, now time.Time) bool {
	return f.held > 0 || now.Sub(f.arrived) < s.ActiveWindow
}

func (s *Share) flow(k string) *shareFlow {
	if s.flows == nil {
		s.flows = map[string]*shareFlow{}
	}
	f := s.flows[k]
	if f == nil {
		f = &shareFlow{}
		s.flows[k] = f
	}
	return f
}
