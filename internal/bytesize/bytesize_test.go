package bytesize

import (
	"math"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"},
		{1023, "1023 B"},
		{-1023, "-1023 B"},
		{1024, "1.0 KiB"},
		{102488 << 10, "100.1 MiB"},
		{131 << 20, "131.0 MiB"},
		{3<<30 + 512<<20, "3.5 GiB"},
		{-(5 << 20), "-5.0 MiB"},
		{2 << 40, "2.0 TiB"},
		{math.MaxInt64, "8.0 EiB"},
	} {
		if got := Format(tc.n); got != tc.want {
			t.Errorf("Format(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestQuantity(t *testing.T) {
	if got := Quantity(nil); got != "" {
		t.Errorf("Quantity(nil) = %q, want empty", got)
	}
	// The two quantities kubectl printed side by side, 131Mi and 102488Ki, in one unit.
	for in, want := range map[string]string{"131Mi": "131.0 MiB", "102488Ki": "100.1 MiB", "24Gi": "24.0 GiB"} {
		q := resource.MustParse(in)
		if got := Quantity(&q); got != want {
			t.Errorf("Quantity(%s) = %q, want %q", in, got, want)
		}
	}
}
