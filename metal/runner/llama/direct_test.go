//go:build cgo && !race

package llama

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestSampleDirect: the draw follows softmax(logits / temperature) exactly where the
// cumulative weights put it, and temperature 0 takes the first largest logit.
func TestSampleDirect(t *testing.T) {
	ln := func(x float64) float32 { return float32(math.Log(x)) }
	// Weights 1:2:4 at temperature 1, 1:4:16 at 0.5; the last token has none to speak of.
	row := []float32{0, ln(2), ln(4), -200}
	cases := []struct {
		temp float32
		u    float64
		want int32
	}{
		{1, 0, 0}, {1, 0.1, 0}, {1, 0.2, 1}, {1, 0.42, 1}, {1, 0.43, 2}, {1, 0.999, 2},
		{0.5, 0.04, 0}, {0.5, 0.1, 1}, {0.5, 0.23, 1}, {0.5, 0.24, 2},
		{0, 0.5, 2}, {-1, 0.5, 2},
	}
	for _, c := range cases {
		if got := sampleDirect(row, c.temp, c.u); got != c.want {
			t.Errorf("temperature %v, u %v: token %d, want %d", c.temp, c.u, got, c.want)
		}
	}
	if got := sampleDirect([]float32{3, 5, 5, 1}, 0, 0); got != 1 {
		t.Errorf("greedy over a tie: token %d, want the first largest (1)", got)
	}
	if got := sampleDirect([]float32{-1e30, -1e30}, 1, 0.9999999); got < 0 || got > 1 {
		t.Errorf("a row of equal tiny logits: token %d", got)
	}
}

// firstLargest is greedy decoding's rule written plainly: the first index whose float
// no later one exceeds (a NaN never exceeds, nor is exceeded).
func firstLargest(row []float32) int32 {
	best := 0
	for i, v := range row {
		if v > row[best] {
			best = i
		}
	}
	return int32(best)
}

// TestArgmax: mf_argmax picks the index firstLargest does, over rows of every length
// around its lanes, a vocabulary's width, ties, NaNs, infinities and signed zeros.
func TestArgmax(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	negZero := float32(math.Copysign(0, -1))
	cases := [][]float32{
		{7}, {1, 3, 3}, {3, 5, 5, 1}, {nan, 5}, {1, nan, 5}, {nan, nan}, {-inf, -inf}, {-inf, -3},
		{negZero, 0, 0}, {0, negZero}, {inf, inf, 2}, {2, nan, inf},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{2, 15, 16, 17, 31, 32, 33, 47, 128256} {
		for range 20 {
			row := make([]float32, n)
			for i := range row {
				row[i] = float32(rng.IntN(64)) // ties are common
			}
			if n > 4 && rng.IntN(3) == 0 {
				row[rng.IntN(n)] = nan
			}
			cases = append(cases, row)
		}
	}
	for i, row := range cases {
		if got, want := argmax(row), firstLargest(row); got != want {
			t.Errorf("case %d (%d floats): index %d, want %d", i, len(row), got, want)
		}
	}
	if got := argmax(nil); got != -1 {
		t.Errorf("no floats: %d, want -1", got)
	}
}
