// Package ledger is a gateway replica's count of its team callers' usage, kept in
// memory on the request path and published as TokenUsage records (one per namespace
// and UTC day, named <gateway>.<YYYY-MM-DD>) by a Writer: the day's tokens and
// requests per key and deployment, and each key's current minute and hour, requests
// in flight and the tokens they reserved, which the other replicas add to their own
// counts when they check a TokenBudget (package budget).
package ledger

import (
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/gateway/budget"
	"github.com/macfleet/macfleet/gateway/metering"
)

// RecordName is the name of gateway's TokenUsage record of day.
func RecordName(gateway string, day time.Time) string {
	return gateway + "." + day.UTC().Format(time.DateOnly)
}

// RenewEvery is how often a namespace with requests in flight is published even
// when nothing else changed, so that the other replicas keep counting them (they
// stop after budget.StaleAfter).
const RenewEvery = 5 * time.Second

// Ledger counts one gateway replica's usage per namespace. It is safe for
// concurrent use; its methods take one short lock.
type Ledger struct {
	gateway string
	clock   clock.PassiveClock

	mu     sync.Mutex
	spaces map[string]*space
	// ended are the records of days that ended before they were written.
	ended []*mfv1.TokenUsage
	// beat is the namespace whose record is renewed every RenewEvery whatever it
	// holds, so that the other replicas know this one is live (SetBeat): the first
	// of beats not closing.
	beat  string
	beats []string
	// closing are the namespaces being deleted (Closing), each until when no record
	// is written there.
	closing map[string]time.Time
}

// ClosingWait is how long a namespace that refused a record as being deleted gets
// none (Closing): then its record is tried again, in case it was made anew.
const ClosingWait = time.Minute

// space is one namespace's counts of the current day.
type space struct {
	day   time.Time
	usage map[usageKey]*mfv1.KeyUsage
	keys  map[string]*budget.Tally
	total budget.Tally
	// dirty: changed since last taken; published: when last taken.
	dirty     bool
	published time.Time
	// restored: the day's record was read back (or found absent) before any write.
	restored bool
}

type usageKey struct{ key, deployment string }

// New is gateway's ledger, empty.
func New(gateway string, c clock.PassiveClock) *Ledger {
	return &Ledger{gateway: gateway, clock: c, spaces: map[string]*space{}}
}

// Gateway is the replica the ledger counts for.
func (l *Ledger) Gateway() string { return l.gateway }

// SetBeat makes the first of namespaces that is not closing (Closing) the namespace
// whose record is renewed every RenewEvery even with nothing in it: the other
// replicas count this one live while it renews a record in any namespace
// (budget.StaleAfter), and then admit budgeted requests only within leases. None
// (or only "") renews none.
func (l *Ledger) SetBeat(namespaces ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.beats = slices.Clone(namespaces)
	l.pickBeat()
}

func (l *Ledger) pickBeat() {
	now := l.clock.Now()
	l.beat = ""
	for _, ns := range l.beats {
		if ns != "" && !l.isClosing(ns, now) {
			l.beat = ns
			return
		}
	}
}

func (l *Ledger) isClosing(ns string, now time.Time) bool {
	until, ok := l.closing[ns]
	if ok && !now.Before(until) {
		delete(l.closing, ns)
		return false
	}
	return ok
}

// Closing writes no record in ns for ClosingWait: the API server refused one because
// ns is being deleted (a namespace stuck terminating refuses every write until it is
// gone). Its counts are kept: its budgets hold while they exist. The beat moves to the
// next namespace SetBeat named.
func (l *Ledger) Closing(ns string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closing == nil {
		l.closing = map[string]time.Time{}
	}
	l.closing[ns] = l.clock.Now().Add(ClosingWait)
	l.ended = slices.DeleteFunc(l.ended, func(tu *mfv1.TokenUsage) bool { return tu.Namespace == ns })
	l.pickBeat()
}

// space is ns's counts of now's day, a new day's once the last one ended. l.mu is held.
func (l *Ledger) space(ns string, now time.Time) *space {
	day := budget.Start(budget.Day, now)
	s := l.spaces[ns]
	if s != nil && s.day.Equal(day) {
		return s
	}
	if s != nil && s.dirty {
		l.ended = append(l.ended, s.record(l.gateway, ns, now))
	}
	n := &space{day: day, usage: map[usageKey]*mfv1.KeyUsage{}, keys: map[string]*budget.Tally{}}
	if s != nil { // requests in flight go on into the new day
		for k, t := range s.keys {
			if t.InFlight > 0 {
				n.keys[k] = &budget.Tally{InFlight: t.InFlight, Reserved: t.Reserved}
			}
		}
		n.total.InFlight, n.total.Reserved, n.restored = s.total.InFlight, s.total.Reserved, true
	}
	l.spaces[ns] = n
	return n
}

func (s *space) key(k string) *budget.Tally {
	t := s.keys[k]
	if t == nil {
		t = &budget.Tally{}
		s.keys[k] = t
	}
	return t
}

// Admit asks decide, under the ledger's lock, whether key of ns may start a request
// that may use up to ask tokens given this replica's own counts, and when it may,
// counts the request in flight and reserves ask for it (or, when decide capped it,
// the decision's Ask): two requests that arrive
// together cannot both take the last concurrent slot or the last tokens of a window.
// done ends an admitted request and releases its reservation; record its usage
// (Record) before. done is nil when refused.
func (l *Ledger) Admit(ns, key string, ask int64, decide func(budget.Own) budget.Decision) (d budget.Decision, done func()) {
	ask = metering.Count(ask)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	s := l.space(ns, now)
	t := s.key(key)
	d = decide(budget.Own{Key: *t, Namespace: s.total})
	if !d.Allowed {
		return d, nil
	}
	if d.Cap > 0 {
		ask = metering.Count(d.Ask)
	}
	t.InFlight++
	t.Reserved = metering.AddCount(t.Reserved, ask)
	s.total.InFlight++
	s.total.Reserved = metering.AddCount(s.total.Reserved, ask)
	s.dirty = true
	return d, sync.OnceFunc(func() { l.end(ns, key, ask) })
}

func (l *Ledger) end(ns, key string, ask int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.space(ns, l.clock.Now())
	if t := s.keys[key]; t != nil && t.InFlight > 0 {
		t.InFlight--
		t.Reserved = max(t.Reserved-ask, 0)
		s.total.InFlight--
		s.total.Reserved = max(s.total.Reserved-ask, 0)
		s.dirty = true
	}
}

// Record counts one answer of deployment (namespace/name) to key of ns.
func (l *Ledger) Record(ns, key, deployment string, u metering.Usage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	s := l.space(ns, now)
	k := usageKey{key, deployment}
	ku := s.usage[k]
	if ku == nil {
		ku = &mfv1.KeyUsage{Key: key, Deployment: deployment}
		s.usage[k] = ku
	}
	add(ku, mfv1.KeyUsage{Requests: 1, InputTokens: u.Input, CachedTokens: u.Cached, OutputTokens: u.Output})
	n := metering.AddCount(u.Input, u.Output)
	s.key(key).Add(now, n)
	s.total.Add(now, n)
	s.dirty = true
}

// Restore adds the counts of the replica's own record tu, as read back from the API
// server after a restart, to today's counts of its namespace, once. A record of
// another day or replica is ignored.
func (l *Ledger) Restore(tu *mfv1.TokenUsage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	if tu.Spec.Gateway != l.gateway || tu.Spec.Day != now.UTC().Format(time.DateOnly) {
		return
	}
	s := l.space(tu.Namespace, now)
	if s.restored {
		return
	}
	s.restored = true
	for _, u := range tu.Spec.Usage {
		k := usageKey{u.Key, u.Deployment}
		ku := s.usage[k]
		if ku == nil {
			ku = &mfv1.KeyUsage{Key: u.Key, Deployment: u.Deployment}
			s.usage[k] = ku
		}
		add(ku, u)
		t := s.key(u.Key)
		t.DayTokens = metering.AddCount(t.DayTokens, metering.AddCount(u.InputTokens, u.OutputTokens))
	}
	// The windows still current count on; requests in flight died with the process.
	for _, w := range tu.Spec.Windows {
		t := s.key(w.Key)
		if w.Minute != nil && w.Minute.UTC().Equal(budget.Start(budget.Minute, now)) {
			t.Minute, t.MinuteTokens = w.Minute.UTC(), metering.AddCount(t.MinuteTokens, w.MinuteTokens)
		}
		if w.Hour != nil && w.Hour.UTC().Equal(budget.Start(budget.Hour, now)) {
			t.Hour, t.HourTokens = w.Hour.UTC(), metering.AddCount(t.HourTokens, w.HourTokens)
		}
	}
	for _, t := range s.keys {
		t.Day = s.day
	}
	s.total = sum(s)
	s.dirty = true
}

// add counts o into u, each count saturating at metering.MaxCount (a record's counts
// never wrap negative, whatever a replica reported or a record read back held).
func add(u *mfv1.KeyUsage, o mfv1.KeyUsage) {
	u.Requests = metering.AddCount(u.Requests, o.Requests)
	u.InputTokens = metering.AddCount(u.InputTokens, o.InputTokens)
	u.CachedTokens = metering.AddCount(u.CachedTokens, o.CachedTokens)
	u.OutputTokens = metering.AddCount(u.OutputTokens, o.OutputTokens)
}

// sum is the namespace's tally from its keys'.
func sum(s *space) budget.Tally {
	tot := budget.Tally{Day: s.day}
	for _, t := range s.keys {
		if t.Minute.After(tot.Minute) {
			tot.Minute, tot.MinuteTokens = t.Minute, 0
		}
		if t.Hour.After(tot.Hour) {
			tot.Hour, tot.HourTokens = t.Hour, 0
		}
	}
	for _, t := range s.keys {
		if t.Minute.Equal(tot.Minute) {
			tot.MinuteTokens = metering.AddCount(tot.MinuteTokens, t.MinuteTokens)
		}
		if t.Hour.Equal(tot.Hour) {
			tot.HourTokens = metering.AddCount(tot.HourTokens, t.HourTokens)
		}
		tot.DayTokens = metering.AddCount(tot.DayTokens, t.DayTokens)
		tot.InFlight += t.InFlight
		tot.Reserved = metering.AddCount(tot.Reserved, t.Reserved)
	}
	return tot
}

// Take returns the records to write: those of the namespaces that changed since they
// were last taken, those with requests in flight or of the beat namespace (SetBeat)
// not published for RenewEvery, and those of days that ended unwritten. A record whose write fails is given back with
// Retry.
func (l *Ledger) Take() []*mfv1.TokenUsage {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	out := l.ended
	l.ended = nil
	l.pickBeat() // a closing namespace's wait may have ended
	if l.beat != "" {
		l.space(l.beat, now)
	}
	for ns := range l.spaces {
		if l.isClosing(ns, now) {
			continue
		}
		s := l.space(ns, now)
		renew := s.total.InFlight > 0 || ns == l.beat
		if !s.dirty && !(renew && now.Sub(s.published) >= RenewEvery) {
			continue
		}
		s.dirty, s.published = false, now
		out = append(out, s.record(l.gateway, ns, now))
	}
	return out
}

// Retry marks the record's namespace to be taken again (its write failed).
func (l *Ledger) Retry(tu *mfv1.TokenUsage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	if tu.Spec.Day != now.UTC().Format(time.DateOnly) {
		l.ended = append(l.ended, tu)
		return
	}
	l.space(tu.Namespace, now).dirty = true
}

// record is s as ns's TokenUsage record at now, its lists sorted.
func (s *space) record(gateway, ns string, now time.Time) *mfv1.TokenUsage {
	rt := metav1.NewMicroTime(now)
	tu := &mfv1.TokenUsage{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: RecordName(gateway, s.day)},
		Spec: mfv1.TokenUsageSpec{Gateway: gateway, Day: s.day.Format(time.DateOnly), RenewTime: &rt,
			Usage: make([]mfv1.KeyUsage, 0, len(s.usage)), Windows: make([]mfv1.KeyWindow, 0, len(s.keys))},
	}
	for _, u := range s.usage {
		tu.Spec.Usage = append(tu.Spec.Usage, *u)
	}
	slices.SortFunc(tu.Spec.Usage, func(a, b mfv1.KeyUsage) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return strings.Compare(a.Deployment, b.Deployment)
	})
	minute, hour := budget.Start(budget.Minute, now), budget.Start(budget.Hour, now)
	for k, t := range s.keys {
		w := mfv1.KeyWindow{Key: k, InFlight: int32(t.InFlight), ReservedTokens: t.Reserved}
		if t.Minute.Equal(minute) {
			m := metav1.NewTime(minute)
			w.Minute, w.MinuteTokens = &m, t.MinuteTokens
		}
		if t.Hour.Equal(hour) {
			h := metav1.NewTime(hour)
			w.Hour, w.HourTokens = &h, t.HourTokens
		}
		if w.Minute == nil && w.Hour == nil && w.InFlight == 0 {
			continue // nothing current to add
		}
		tu.Spec.Windows = append(tu.Spec.Windows, w)
	}
	slices.SortFunc(tu.Spec.Windows, func(a, b mfv1.KeyWindow) int { return strings.Compare(a.Key, b.Key) })
	return tu
}
