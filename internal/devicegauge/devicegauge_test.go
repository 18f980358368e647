package devicegauge

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []Card
		err      string
	}{
		{name: "one card", in: "0, NVIDIA H100 80GB HBM3, 81559, 4\n",
			want: []Card{{Index: 0, Name: "NVIDIA H100 80GB HBM3", TotalBytes: 81559 << 20, UsedBytes: 4 << 20}}},
		{name: "two cards", in: "0, NVIDIA H100 80GB HBM3, 81559, 4893\n1, NVIDIA H100 80GB HBM3, 81559, 0\n",
			want: []Card{{0, "NVIDIA H100 80GB HBM3", 81559 << 20, 4893 << 20}, {1, "NVIDIA H100 80GB HBM3", 81559 << 20, 0}}},
		{name: "a comma in the name", in: "0, Card, Rev 2, 1024, 10\n",
			want: []Card{{0, "Card, Rev 2", 1024 << 20, 10 << 20}}},
		{name: "none", in: "\n"},
		{name: "no memory figure", in: "0, Some Card, [N/A], [N/A]\n", err: "[N/A]"},
		{name: "short line", in: "0, H100\n", err: "want index, name"},
		{name: "bad index", in: "x, H100, 1, 1\n", err: "index"},
		{name: "negative", in: "0, H100, -1, 1\n", err: "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Parse error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("card %d: %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// TestNVIDIATool runs a stand-in tool: the arguments the driver's tool is asked with,
// its answer parsed, its failure reported with its own words, and no tool at all.
func TestNVIDIATool(t *testing.T) {
	dir := t.TempDir()
	tool := filepath.Join(dir, "nvidia-smi")
	script := "#!/bin/sh\n[ \"$1 $2\" = \"" + strings.Join(query, " ") + "\" ] || { echo \"bad args: $*\" >&2; exit 9; }\n" +
		"echo '0, NVIDIA H100 80GB HBM3, 81559, 512'\n"
	if err := os.WriteFile(tool, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	cards, err := NVIDIA{Path: tool}.Cards(context.Background())
	if err != nil || len(cards) != 1 || cards[0].UsedBytes != 512<<20 || Used(cards) != 512<<20 {
		t.Fatalf("Cards = %+v, %v", cards, err)
	}
	broken := filepath.Join(dir, "broken")
	if err := os.WriteFile(broken, []byte("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver' >&2\nexit 9\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := (NVIDIA{Path: broken}).Cards(context.Background()); err == nil || !strings.Contains(err.Error(), "could not communicate") {
		t.Errorf("a failing tool: %v", err)
	}
	t.Setenv("PATH", t.TempDir())
	if _, err := (NVIDIA{}).Cards(context.Background()); !errors.Is(err, ErrNoTool) {
		t.Errorf("no tool: %v, want ErrNoTool", err)
	}
}

// countingGauge counts its readings.
type countingGauge struct{ n int }

func (c *countingGauge) Cards(context.Context) ([]Card, error) {
	c.n++
	return []Card{{Name: "card", UsedBytes: int64(c.n)}}, nil
}

// TestCached: within its period the cache answers from one reading; after it, reads again.
func TestCached(t *testing.T) {
	g := &countingGauge{}
	c := Cached(g, time.Hour)
	for range 3 {
		if cards, _ := c.Cards(context.Background()); cards[0].UsedBytes != 1 {
			t.Fatalf("reading %d, want the first", cards[0].UsedBytes)
		}
	}
	if g.n != 1 {
		t.Errorf("%d readings within the period, want 1", g.n)
	}
	c = Cached(g, 0)
	c.Cards(context.Background())
	c.Cards(context.Background())
	if g.n != 3 {
		t.Errorf("%d readings with no period, want 3", g.n)
	}
	if Cached(nil, time.Second) != nil {
		t.Error("a cache of no gauge is a gauge")
	}
}
