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
