package decide

import (
	"slices"
	"testing"
)

func TestSelectVictim(t *testing.T) {
	c := func(name string, used int, g int64) Candidate {
		return Candidate{Name: name, LastUsed: at(used), Bytes: g * gib}
	}
	for _, tc := range []struct {
		name   string
		cands  []Candidate
		target int64
		want   string
	}{
		{name: "none", want: ""},
		{name: "plain LRU", cands: []Candidate{c("new", 9, 1), c("old", 1, 1), c("mid", 5, 8)}, want: "old"},
		{name: "LRU tie: larger first", cands: []Candidate{c("small", 1, 1), c("big", 1, 4)}, want: "big"},
		{name: "LRU tie: then name", cands: []Candidate{c("y", 1, 2), c("x", 1, 2)}, want: "x"},
		{name: "target: LRU that alone frees enough", target: 3 * gib,
			cands: []Candidate{c("oldsmall", 1, 1), c("midbig", 5, 4), c("newbig", 9, 8)}, want: "midbig"},
		{name: "target: exactly enough counts", target: 4 * gib,
			cands: []Candidate{c("old", 1, 4), c("newbig", 9, 8)}, want: "old"},
		{name: "target: none frees enough, the largest", target: 10 * gib,
			cands: []Candidate{c("old", 1, 2), c("big", 5, 6), c("mid", 3, 4)}, want: "big"},
		{name: "target: largest tie goes to the older", target: 10 * gib,
			cands: []Candidate{c("newer", 5, 6), c("older", 3, 6)}, want: "older"},
		{name: "zero target is plain LRU", target: 0,
			cands: []Candidate{c("old", 1, 1), c("big", 2, 9)}, want: "old"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := SelectVictim(tc.cands, tc.target)
			if got.Name != tc.want || ok != (tc.want != "") {
				t.Fatalf("SelectVictim = %q %v, want %q", got.Name, ok, tc.want)
			}
		})
	}
}

// Candidates are Ready, unpinned, unleased, not being torn down and not the model
// being admitted; Loading, Draining and Stopping models never are.
func TestCandidates(t *testing.T) {
	models := []Model{
		ready("idle", 1, 1),
		with(ready("leased", 1, 1), busy),
		with(ready("pinned", 1, 1), pinned),
		with(ready("draining", 1, 1), draining),
		with(ready("stopping", 1, 1), stopping),
		with(ready("loading", 1, 1), loading),
		with(ready("admitting", 1, 1), unadmitted),
		with(ready("tearing", 1, 1), func(m *Model) { m.Engine.TearingDown = true }),
		{Name: "absent", State: StateAbsent},
		with(ready("resident", 2, 5), footprint(3*gib)),
	}
	for _, tc := range []struct {
		name    string
		exclude string
		want    []Candidate
	}{
		{name: "excluding the admitted one", exclude: "idle",
			want: []Candidate{{Name: "resident", LastUsed: at(5), Bytes: 3 * gib}}},
		{name: "bytes are the larger of footprint and reservation", exclude: "",
			want: []Candidate{{Name: "idle", LastUsed: at(1), Bytes: 1 * gib}, {Name: "resident", LastUsed: at(5), Bytes: 3 * gib}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Candidates(models, tc.exclude)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Candidates = %+v, want %+v", got, tc.want)
			}
		})
	}
	if v, ok := Victim(nil, "", 0); ok || v != "" {
		t.Fatalf("Victim of no models = %q %v, want none", v, ok)
	}
}
