package speculate

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestLookup(t *testing.T) {
	for _, tc := range []struct {
		name       string
		hist       []int32
		minN, maxN int
		k          int
		want       []int32
		wantN      int
	}{
		{"copies what followed the last three", []int32{1, 2, 3, 4, 5, 6, 9, 1, 2, 3}, 1, 3, 3, []int32{4, 5, 6}, 3},
		{"stops at the history's end", []int32{1, 2, 3, 4, 1, 2, 3}, 1, 3, 8, []int32{4, 1, 2, 3}, 3},
		{"the most recent occurrence", []int32{1, 2, 7, 1, 2, 8, 1, 2}, 2, 2, 1, []int32{8}, 2},
		{"falls back to a shorter tail", []int32{5, 2, 3, 4, 9, 3}, 1, 3, 2, []int32{4, 9}, 1},
		{"nothing below minN", []int32{5, 2, 3, 4, 9, 3}, 2, 3, 2, nil, 0},
		{"no earlier occurrence", []int32{1, 2, 3, 4}, 1, 3, 4, nil, 0},
		{"k zero drafts nothing", []int32{1, 2, 1, 2}, 1, 2, 0, nil, 0},
		{"one token of history", []int32{1}, 1, 3, 4, nil, 0},
		{"a loop drafts itself", []int32{7, 7, 7, 7}, 1, 3, 2, []int32{7}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, n := Lookup(tc.hist, tc.minN, tc.maxN, tc.k); !slices.Equal(got, tc.want) || n != tc.wantN {
				t.Fatalf("Lookup(%v, %d, %d, %d) = %v, %d; want %v, %d", tc.hist, tc.minN, tc.maxN, tc.k, got, n, tc.want, tc.wantN)
			}
		})
	}
}

func TestFollow(t *testing.T) {
	for _, tc := range []struct {
		name      string
		src, hist []int32
		k         int
		want      []int32
		wantN     int
	}{
		{"what follows the answer's tail in the prediction", []int32{1, 2, 3, 4, 5, 6}, []int32{9, 9, 2, 3}, 3, []int32{4, 5, 6}, 2},
		{"the longest tail first", []int32{3, 8, 8, 2, 3, 4}, []int32{2, 3}, 2, []int32{4}, 2},
		{"the latest occurrence", []int32{5, 1, 6, 5, 1, 7}, []int32{5, 1}, 1, []int32{7}, 2},
		{"the answer's first token starts the prediction's draft", []int32{4, 5, 6, 7}, []int32{100, 101, 4}, 8, []int32{5, 6, 7}, 1},
		{"a tail at the prediction's end drafts nothing", []int32{1, 2, 3}, []int32{2, 3}, 4, nil, 0},
		{"no tail in the prediction", []int32{1, 2, 3}, []int32{9}, 4, nil, 0},
		{"no prediction", nil, []int32{1, 2}, 4, nil, 0},
		{"k zero", []int32{1, 2, 3}, []int32{1}, 0, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, n := Follow(tc.src, tc.hist, 1, 3, tc.k); !slices.Equal(got, tc.want) || n != tc.wantN {
				t.Fatalf("Follow(%v, %v, 1, 3, %d) = %v, %d; want %v, %d", tc.src, tc.hist, tc.k, got, n, tc.want, tc.wantN)
			}
		})
	}
}

func TestVerify(t *testing.T) {
	for _, tc := range []struct {
		name    string
		draft   []int32
		samples []int32 // what each row samples
		want    []int32
	}{
		{"no draft samples one row", nil, []int32{4}, []int32{4}},
		{"the first row disagrees", []int32{1, 2}, []int32{9, 2, 3}, []int32{9}},
		{"keeps the agreeing prefix", []int32{1, 2, 3}, []int32{1, 2, 8, 4}, []int32{1, 2, 8}},
		{"all agree and one more", []int32{1, 2}, []int32{1, 2, 5}, []int32{1, 2, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows := 0
			got, err := Verify(tc.draft, func(i int) (int32, error) {
				rows++
				if i != rows-1 {
					t.Fatalf("sampled row %d out of order", i)
				}
				return tc.samples[i], nil
			})
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("Verify = %v, %v; want %v", got, err, tc.want)
			}
			if rows != len(tc.want) {
				t.Fatalf("sampled %d rows, want %d", rows, len(tc.want))
			}
		})
	}
	boom := errors.New("boom")
	if _, err := Verify([]int32{1}, func(int) (int32, error) { return 0, boom }); !errors.Is(err, boom) {
		t.Fatalf("Verify's error = %v, want boom", err)
	}
}

// TestVerifyKeepsTheDistribution checks, on a small vocabulary at temperature 1,
// that the tokens Verify yields at each position have the target's distribution
// whatever the draft: a chi-square test of the first two positions' tokens against
// p (each position's row depends on the token before it). verifyOneTooMany, a verify
// that keeps one drafted token past the first disagreement, fails it.
func TestVerifyKeepsTheDistribution(t *testing.T) {
	// p(next | prev) over a vocabulary of 4: a fixed table.
	p := [4][4]float64{{.5, .2, .2, .1}, {.1, .6, .2, .1}, {.25, .25, .25, .25}, {.05, .05, .1, .8}}
	const trials = 40000
	run := func(verify func([]int32, func(int) (int32, error)) ([]int32, error)) float64 {
		rng := rand.New(rand.NewPCG(1, 2))
		var seen [4][4]int // the first two tokens' pairs
		var first [4]int
		for range trials {
			prev := int32(0)
			draft := []int32{2, 3} // fixed and often wrong
			// Row i's distribution follows the token at the position before it:
			// row 0 follows prev, row i+1 follows draft[i].
			got, _ := verify(draft, func(i int) (int32, error) {
				ctx := prev
				if i > 0 {
					ctx = draft[i-1]
				}
				return draw(rng, p[ctx]), nil
			})
			first[got[0]]++
			if len(got) > 1 {
				seen[got[0]][got[1]]++
			}
		}
		chi := chiSquare(first[:], p[0][:], trials)
		// The second token, given the first, where one followed.
		for a := range 4 {
			n := 0
			for b := range 4 {
				n += seen[a][b]
			}
			if n > 0 {
				chi += chiSquare(seen[a][:], p[a][:], n)
			}
		}
		return chi
	}
	// Degrees of freedom: 3 for the first token, 3 for the second (only after token 2,
	// the drafted first token): 6; p(chi2 > 30) < 1e-4.
	const bound = 30
	if chi := run(Verify); chi > bound {
		t.Fatalf("Verify's tokens are off the target's distribution: chi-square %.1f > %d", chi, bound)
	}
	if chi := run(verifyOneTooMany); chi <= bound {
		t.Fatalf("the test does not catch a verify that keeps one token too many: chi-square %.1f <= %d", chi, bound)
	}
}

// verifyOneTooMany is a broken verify that keeps the drafted token where the first
// sample disagreed.
func verifyOneTooMany(draft []int32, sample func(int) (int32, error)) ([]int32, error) {
	out, err := Verify(draft, sample)
	if err == nil && len(out) <= len(draft) && out[len(out)-1] != draft[len(out)-1] {
		out[len(out)-1] = draft[len(out)-1]
		tok, err := sample(len(out))
		return append(out, tok), err
	}
	return out, err
}

func draw(rng *rand.Rand, p [4]float64) int32 {
	u := rng.Float64()
	for i, q := range p {
		if u < q {
			return int32(i)
		}
		u -= q
	}
	return int32(len(p) - 1)
}

func chiSquare(counts []int, p []float64, n int) float64 {
	chi := 0.0
	for i, c := range counts {
		e := p[i] * float64(n)
		chi += math.Pow(float64(c)-e, 2) / e
	}
	return chi
}

func TestPolicy(t *testing.T) {
	type note struct{ proposed, accepted int }
	for _, tc := range []struct {
		name  string
		notes []note
		room  int
		want  int // the next Size
	}{
		{"fresh", nil, 100, startK},
		{"room bounds it", nil, 2, 2},
		{"a whole draft doubles", []note{{4, 4}}, 100, 8},
		{"up to Max", []note{{4, 4}, {8, 8}}, 100, DefaultMax},
		{"cut short drafts one more than kept", []note{{4, 2}}, 100, 3},
		{"one miss drafts one", []note{{4, 0}}, 100, 1},
		{"misses cool down", []note{{4, 0}, {1, 0}}, 100, 0},
		{"a hit ends the misses", []note{{4, 0}, {1, 1}, {2, 0}}, 100, 1},
		{"nothing proposed counts nothing", []note{{4, 0}, {0, 0}}, 100, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPolicy(DefaultMax)
			for _, n := range tc.notes {
				p.Note(n.proposed, n.accepted)
			}
			if got := p.Size(tc.room, false); got != tc.want {
				t.Fatalf("Size = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestPolicyStrongDraftPassesACoolDown(t *testing.T) {
	p := NewPolicy(DefaultMax)
	p.Note(4, 0)
	p.Note(1, 0)
	if got := p.Size(100, false); got != 0 {
		t.Fatalf("a weak draft in a cool-down: Size %d, want 0", got)
	}
	if got := p.Size(100, true); got != startK {
		t.Fatalf("a strong draft in a cool-down: Size %d, want %d", got, startK)
	}
}

func TestPolicyCoolDownDoubles(t *testing.T) {
	p := NewPolicy(DefaultMax)
	skipped := func() int {
		n := 0
		for p.Size(100, false) == 0 {
			n++
		}
		return n
	}
	p.Note(4, 0)
	p.Note(1, 0)
	if got := skipped(); got != firstCool {
		t.Fatalf("first cool-down %d steps, want %d", got, firstCool)
	}
	p.Note(4, 0)
	p.Note(1, 0)
	if got := skipped(); got != 2*firstCool {
		t.Fatalf("second cool-down %d steps, want %d", got, 2*firstCool)
	}
	p.Note(4, 3) // a hit resets it
	p.Note(4, 0)
	p.Note(1, 0)
	if got := skipped(); got != firstCool {
		t.Fatalf("cool-down after a hit %d steps, want %d", got, firstCool)
	}
}
