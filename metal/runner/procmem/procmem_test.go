package procmem

import (
	"runtime"
	"strings"
	"testing"
)

func TestParseRollup(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    int64
		wantErr bool
	}{
		{"rss line", "00400000-7ffd [rollup]\nRss:              123456 kB\nPss:  1 kB\n", 123456 * 1024, false},
		{"no rss", "Pss: 1 kB\n", 0, true},
		{"garbage", "Rss: lots kB\n", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseRollup(strings.NewReader(tt.in))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("parseRollup() = %d, %v; want %d, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
	if got, err := parseStatm("100 25 3 1 0 20 0", 4096); err != nil || got != 25*4096 {
		t.Errorf("parseStatm() = %d, %v", got, err)
	}
}

// The footprint follows a real allocation.
func TestSelfGrowsWithTouchedMemory(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		t.Skip("not measured on", runtime.GOOS)
	}
	before, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<20)
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 1
	}
	after, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 48<<20 {
		t.Errorf("footprint grew by %d bytes after touching 64 MiB", after-before)
	}
	runtime.KeepAlive(buf)
}

// TestQuickTracksSelf: the constant-time reading the prefill guard takes first grows
// with touched memory and stays near the exact one.
func TestQuickTracksSelf(t *testing.T) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" {
		t.Skip("not measured on", runtime.GOOS)
	}
	before, err := Quick()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<20)
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 1
	}
	quick, err := Quick()
	if err != nil {
		t.Fatal(err)
	}
	exact, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if quick-before < 48<<20 {
		t.Errorf("quick reading grew by %d bytes after touching 64 MiB", quick-before)
	}
	if d := quick - exact; d > 16<<20 || d < -16<<20 {
		t.Errorf("quick reading %d bytes, exact %d: %d apart", quick, exact, d)
	}
	runtime.KeepAlive(buf)
}

// BenchmarkSelf and BenchmarkQuick read the footprint with 256 MiB touched (the prefill
// guard's cost per request; compare the two in one run).
func BenchmarkSelf(b *testing.B)  { benchRead(b, Self) }
func BenchmarkQuick(b *testing.B) { benchRead(b, Quick) }

func benchRead(b *testing.B, read func() (int64, error)) {
	buf := make([]byte, 256<<20)
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 1
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := read(); err != nil {
			b.Fatal(err)
		}
	}
	runtime.KeepAlive(buf)
}
