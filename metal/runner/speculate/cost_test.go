package speculate

import (
	"math"
	"testing"
	"time"
)

func TestBucket(t *testing.T) {
	for _, tc := range []struct{ n, want int }{
		{0, 0}, {1, 0}, {2, 1}, {16, 15}, {17, 16}, {64, 63}, {65, 64}, {128, 64}, {129, 65}, {2048, 68}, {2049, 69}, {1 << 20, buckets - 1},
	} {
		if got := bucket(tc.n); got != tc.want {
			t.Errorf("bucket(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}

// costs is a Costs with each (tokens, seconds) observed once.
func costs(obs ...[2]float64) *Costs {
	var c Costs
	for _, o := range obs {
		c.Observe(int(o[0]), o[1])
	}
	return &c
}

func TestPays(t *testing.T) {
	type obs = [2]float64
	for _, tc := range []struct {
		name          string
		plain, extra  *Costs
		base, drafted int
		kept          float64
		want          bool
	}{
		{"nothing measured: try it", costs(), costs(), 1, 4, 0, true},
		{"no draft", costs(obs{1, 0.01}), costs(), 1, 0, 5, false},
		{"flat step: any kept token pays", costs(obs{1, 0.010}), costs(obs{4, 0.0001}), 1, 4, 0.5, true},
		{"flat step: nothing kept does not", costs(obs{1, 0.010}), costs(obs{4, 0.0001}), 1, 4, 0, false},
		{"per-row step, one stream: 4 rows cost 4 steps, 2.5 kept do not pay", costs(obs{1, 0.001}), costs(obs{4, 0.004}), 1, 4, 2.5, false},
		{"per-row step, one stream: 4.5 kept would", costs(obs{1, 0.001}), costs(obs{4, 0.004}), 1, 4, 4.5, true},
		{"16 streams: drafts adding 10 % need 1.6 kept", costs(obs{16, 0.010}), costs(obs{8, 0.001}), 16, 8, 1.5, false},
		{"16 streams: 1.7 kept pays", costs(obs{16, 0.010}), costs(obs{8, 0.001}), 16, 8, 1.7, true},
		{"a count never measured: taken for the nearest smaller, tried", costs(obs{1, 0.001}), costs(obs{1, 0.00001}), 1, 8, 0.1, true},
		{"per-row step, 5 streams: 3 rows more are not free", costs(obs{5, 0.005}), costs(obs{3, 0.003}), 5, 3, 0.5, false},
		{"a count between two measured ones costs the line between them", costs(obs{16, 0.016}), costs(obs{1, 0.0005}, obs{3, 0.0015}), 16, 2, 0.9, false},
		{"and pays when more is kept", costs(obs{16, 0.016}), costs(obs{1, 0.0005}, obs{3, 0.0015}), 16, 2, 1.1, true},
		{"a plain size never measured takes the nearest measured one's time", costs(obs{16, 0.002}), costs(obs{8, 0.0026}), 7, 8, 5, false},
		{"and pays past it", costs(obs{16, 0.002}), costs(obs{8, 0.0026}), 7, 8, 9.2, true},
		{"or the line between two: 1.25 ms for 7", costs(obs{4, 0.001}, obs{16, 0.002}), costs(obs{8, 0.0026}), 7, 8, 14.5, false},
		{"which 14.7 kept pay", costs(obs{4, 0.001}, obs{16, 0.002}), costs(obs{8, 0.0026}), 7, 8, 14.7, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Pays(tc.plain, tc.extra, tc.base, tc.drafted, tc.kept); got != tc.want {
				t.Errorf("Pays(%d, %d, %v) = %v, want %v", tc.base, tc.drafted, tc.kept, got, tc.want)
			}
		})
	}
}

func TestObserveSmooths(t *testing.T) {
	var c Costs
	c.Observe(4, 1)
	c.Observe(4, 2)
	got, ok := c.Time(4)
	if !ok || math.Abs(got-(1+alpha)) > 1e-9 {
		t.Errorf("Time(4) = %v, %v; want %v, true", got, ok, 1+alpha)
	}
	c.Observe(0, 5)
	c.Observe(2, -1)
	if got, ok := c.Time(2); ok || got != 0 {
		t.Errorf("Time(2) = %v, %v after ignored observations; want 0, false", got, ok)
	}
	if got, ok := c.Time(100); ok || got != 1+alpha {
		t.Errorf("Time(100) = %v, %v; want the nearest smaller bucket's %v, false", got, ok, 1+alpha)
	}
	c.Observe(8, 2)
	if got, ok := c.Time(6); ok || math.Abs(got-(1+alpha+(2-1-alpha)/2)) > 1e-9 {
		t.Errorf("Time(6) = %v, %v; want half way between Time(4) and Time(8), false", got, ok)
	}
}

func TestRate(t *testing.T) {
	var r Rate
	if r.Share() != 0.5 || math.Abs(r.Expect(2)-0.75) > 1e-9 {
		t.Fatalf("fresh rate: share %v, expect(2) %v; want 0.5, 0.75", r.Share(), r.Expect(2))
	}
	r.Note(4, 4)
	r.Note(4, 4)
	if r.Share() != 1 || r.Expect(3) != 3 {
		t.Errorf("all kept: share %v, expect(3) %v; want 1, 3", r.Share(), r.Expect(3))
	}
	for range 20 {
		r.Note(4, 0)
	}
	if r.Share() > 0.05 {
		t.Errorf("after 20 drafts that kept nothing the share is %v, want under 0.05", r.Share())
	}
	r.Note(0, 0)
	if r.Expect(0) != 0 {
		t.Errorf("Expect(0) = %v", r.Expect(0))
	}
}

// TestGate: where drafted rows cost as decoded ones (a step of 5 tokens 5 times one
// of 1), a draft expected to keep 2 of 4 is refused, except on an exploring step;
// where they are nearly free it is let through; a step with a prefill is not
// measured.
func TestGate(t *testing.T) {
	var g Gate
	if !g.Allows(Plan{Base: 1}, 4, 0, false) {
		t.Fatal("a fresh gate refused a draft: it knows nothing yet")
	}
	// The first step of each size sets it up and is not measured: an hour each.
	g.Stepped(1, 0, time.Hour, false, 0)
	g.Stepped(1, 0, time.Millisecond, false, 0)
	g.Stepped(5, 4, time.Hour, false, 1)
	g.Stepped(1, 0, time.Millisecond, false, 0)
	g.Stepped(5, 4, 5*time.Millisecond, false, 1)
	g.Stepped(1, 0, time.Millisecond, false, 0)   // charges the drafting step nothing more
	g.Stepped(5, 0, 50*time.Millisecond, true, 0) // a prefill's step: not a decode's time
	if g.Allows(Plan{Base: 1}, 4, 2, false) {
		t.Errorf("rows that cost as tokens: a draft keeping 2 of 4 allowed (extra %v)", g.extra[1].ewma[:4])
	}
	if !g.Allows(Plan{Base: 1}, 4, 4.5, false) {
		t.Errorf("a draft expected to keep more than it costs refused (extra %v)", g.extra[1].ewma[:4])
	}
	if !g.Allows(Plan{Base: 1}, 4, 0, true) {
		t.Errorf("a draft the runner tries refused")
	}
	strong := FromLookup(3)
	if !g.Tries(strong) {
		t.Errorf("a source never drafted from is not tried")
	}
	g.Note(strong, triedAfter, triedAfter/2)
	if g.steps%ExploreEvery == 0 {
		t.Fatalf("step %d explores", g.steps)
	}
	if g.Tries(strong) {
		t.Errorf("step %d: a source drafted from %d times is tried on a step that does not explore", g.steps, triedAfter)
	}
	for g.steps%ExploreEvery != 0 {
		g.Stepped(1, 0, time.Millisecond, false, 0)
	}
	if !g.Tries(strong) {
		t.Errorf("step %d explores: a draft is not tried", g.steps)
	}
	if g.Allows(Plan{Base: 1}, 4, 0, false) {
		t.Errorf("step %d explores: a draft not tried (the engine tries one a step) let through", g.steps)
	}
	g.Stepped(1, 0, time.Millisecond, false, 0)
	if g.Tries(strong) {
		t.Errorf("the step after an exploring one tries a tried source")
	}
	weak := FromLookup(1)
	if p := g.Prior(); p[weak].Share() != 0.5 {
		t.Errorf("a fresh gate's prior share %v, want 0.5", p[weak].Share())
	}
	for range 10 {
		g.Note(weak, 4, 0)
	}
	if p := g.Prior(); p[weak].Share() > 0.2 || p.Expect(weak, 4) > 0.25 {
		t.Errorf("after ten drafts that kept nothing, a new answer starts at share %v (expects %v of 4)", p[weak].Share(), p.Expect(weak, 4))
	}
	var flat Gate
	flat.Stepped(1, 0, 10*time.Millisecond, false, 0)
	flat.Stepped(1, 0, 10*time.Millisecond, false, 0)
	for range 2 {
		flat.Stepped(5, 4, 10100*time.Microsecond, false, 1)
		flat.Stepped(1, 0, 10*time.Millisecond, false, 0)
	}
	if !flat.Allows(Plan{Base: 1}, 4, 0.5, false) {
		t.Errorf("nearly free rows: a draft keeping half a token refused")
	}
}

// TestGateChargesTheStepAfter: a drafting step that costs little itself but makes the
// plain step after it slow (a graph recorded again) is charged with the difference,
// and then refused.
func TestGateChargesTheStepAfter(t *testing.T) {
	var g Gate
	for range 3 {
		g.Stepped(1, 0, time.Millisecond, false, 0)
	}
	g.Stepped(5, 4, time.Hour, false, 1) // the count's first step: not measured
	g.Stepped(1, 0, time.Millisecond, false, 0)
	if _, ok := g.extra[1].Time(4); ok {
		t.Fatal("the first step of a count of drafted tokens was measured")
	}
	g.Stepped(5, 4, 1100*time.Microsecond, false, 1) // cheap by itself
	if g.pending.ok != true {
		t.Fatal("the drafting step was measured before the step after it")
	}
	g.Stepped(1, 0, 3*time.Millisecond, false, 0) // 2 ms more than a plain step
	got, ok := g.extra[1].Time(4)
	if !ok || got < 0.0020 || got > 0.0022 {
		t.Errorf("the drafts add %v s, want 2.1 ms: their own 0.1 and the 2 they added after", got)
	}
	if plain, _ := g.plain.Time(1); plain != 0.001 {
		t.Errorf("the plain step after a draft was measured as plain: %v", plain)
	}
	g.steps = 1
	if g.Allows(Plan{Base: 1}, 4, 1.5, false) {
		t.Error("a draft expected to keep 1.5 allowed where it costs 2.1 steps")
	}
}

// TestGateReachesAnUnknownSizeWithOneDraft: where only sixteen-token steps were
// measured, one slot's draft is let through (that measures it), a second slot's in
// the same step is not, even on an exploring step or from an untried source; once
// counts around it are measured, the second is judged by its expected times like any
// other.
func TestGateReachesAnUnknownSizeWithOneDraft(t *testing.T) {
	var g Gate
	for range 3 {
		g.Stepped(16, 0, 2*time.Millisecond, false, 0)
	}
	p := Plan{Base: 16}
	if !g.Allows(p, 3, 1, false) {
		t.Fatal("one slot's draft of an unmeasured count refused")
	}
	g.Add(&p, 3, 1)
	if g.Allows(p, 3, 1, false) {
		t.Error("a second slot's draft of an unmeasured count allowed")
	}
	if g.Allows(p, 3, 1, true) {
		t.Error("a second slot's draft from an untried source of an unmeasured count allowed")
	}
	explore := g
	for explore.steps%ExploreEvery != 0 {
		explore.steps++
	}
	if explore.Allows(p, 3, 1, explore.Tries(FromModel)) {
		t.Error("an exploring step's second draft of an unmeasured count allowed")
	}
	for range 3 { // a count's first step is not measured
		g.Stepped(19, 3, 2100*time.Microsecond, false, 1)
		g.Stepped(20, 4, 2100*time.Microsecond, false, 2)
		g.Stepped(24, 8, 2100*time.Microsecond, false, 2)
	}
	p = Plan{Base: 16}
	g.Add(&p, 3, 1)
	if !g.Allows(p, 3, 1, false) {
		t.Errorf("a second draft of a count between measured ones, nearly free, refused (extra %v)", g.extra[2].ewma[:8])
	}
}

// TestGateCountsDraftingSlots: what drafts add to a step is judged by how many slots
// drafted as well as by how many tokens, and not by how many slots decode beside
// them. Where one slot's draft of 6 adds 10 % to sixteen plain tokens (one more
// graph of six rows, where rows are nearly free) and two slots' drafts of 3 each
// double the step (two more graphs, each a pass over the weights), one slot's draft
// keeping 2 pays and a second slot's does not; and the same draft pays beside twelve
// streams, whose plain steps alone were measured.
func TestGateCountsDraftingSlots(t *testing.T) {
	var g Gate
	for range 3 {
		g.Stepped(16, 0, 2*time.Millisecond, false, 0)
		g.Stepped(12, 0, 1800*time.Microsecond, false, 0)
	}
	for range 3 {
		g.Stepped(22, 6, 2200*time.Microsecond, false, 1)
		g.Stepped(22, 6, 4*time.Millisecond, false, 2)
	}
	g.steps = 1 // not an exploring step
	one := Plan{Base: 16}
	if !g.Allows(one, 6, 2, false) {
		t.Errorf("one slot's draft of 6 keeping 2 refused where it adds 10 %% (extra %v)", g.extra[1].ewma[:8])
	}
	two := Plan{Base: 16}
	g.Add(&two, 3, 1)
	if g.Allows(two, 3, 1, false) {
		t.Errorf("a second slot's draft allowed where two drafting slots double the step (extra %v)", g.extra[2].ewma[:8])
	}
	if two.Drafters != 1 || two.Drafted != 3 || two.Kept != 1 {
		t.Errorf("plan after one draft: %+v", two)
	}
	if !g.Allows(Plan{Base: 12}, 6, 2, false) {
		t.Errorf("beside twelve streams, one slot's draft of 6 keeping 2 refused (extra %v)", g.extra[1].ewma[:8])
	}
}

// TestRatesBySource: drafts from one source that keep nothing (the 1-token matches of
// an answer's first words) leave another source's expectation (3-token matches that
// keep everything) where its own drafts put it, and each lookup length has its own.
func TestRatesBySource(t *testing.T) {
	var r Rates
	weak, strong := FromLookup(1), FromLookup(3)
	for range 3 {
		r.Note(weak, 8, 0)
		r.Note(strong, 8, 8)
	}
	if e := r.Expect(weak, 8); e > 0.1 {
		t.Errorf("after three weak drafts kept nothing, expects %.2f of 8", e)
	}
	if e := r.Expect(strong, 8); e < 6 {
		t.Errorf("after three strong drafts kept whole, expects only %.2f of 8", e)
	}
	if r[weak].Untried() || r[strong].Untried() || !r[FromModel].Untried() {
		t.Errorf("after three drafts of 8: untried weak %v, strong %v; a draft model with none untried %v",
			r[weak].Untried(), r[strong].Untried(), r[FromModel].Untried())
	}
	var ones Rate
	for range triedAfter {
		if !ones.Untried() {
			t.Fatalf("tried after %v of %d one-token drafts", ones, triedAfter)
		}
		ones.Note(1, 0)
	}
	for range 50 {
		if ones.Note(1, 0); ones.Untried() {
			t.Fatalf("a source of one-token drafts that keep nothing is untried again: %+v", ones)
		}
	}
	if e := r.Expect(FromModel, 4); e != (Rate{}).Expect(4) {
		t.Errorf("a source with no draft yet expects %.2f of 4, want the even chance's %.2f", e, (Rate{}).Expect(4))
	}
	for _, c := range []struct {
		n    int
		want Source
	}{{0, fromLookup}, {1, fromLookup}, {2, fromLookup + 1}, {3, fromLookup + 2}, {4, fromLookup + 3}, {9, fromLookup + 3}} {
		if got := FromLookup(c.n); got != c.want || got >= sources {
			t.Errorf("FromLookup(%d) = %d, want %d (of %d sources)", c.n, got, c.want, sources)
		}
	}
	if FromLookup(1) == FromPrediction || FromLookup(1) == FromModel {
		t.Error("a lookup's source is shared with a prediction's or a draft model's")
	}
}
