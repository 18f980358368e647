//go:build cgo && !race

package llama

import (
	"math"
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
