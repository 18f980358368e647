package server

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPipelineSlots(t *testing.T) {
	for _, tc := range []struct {
		name             string
		parallel, groups int
		split            bool
		want             []int
		wantErr          bool
	}{
		{name: "one context", parallel: 4, groups: 1, want: []int{4}},
		{name: "one context unsplit", parallel: 3, groups: 1, split: false, want: []int{3}},
		{name: "two contexts", parallel: 4, groups: 2, split: true, want: []int{2, 2}},
		{name: "three contexts", parallel: 6, groups: 3, split: true, want: []int{2, 2, 2}},
		{name: "one slot each", parallel: 2, groups: 2, split: true, want: []int{1, 1}},
		{name: "uneven", parallel: 5, groups: 2, split: true, wantErr: true},
		{name: "more contexts than slots", parallel: 1, groups: 2, split: true, wantErr: true},
		{name: "not split", parallel: 4, groups: 2, wantErr: true},
		{name: "zero", parallel: 4, groups: 0, split: true, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pipelineSlots(tc.parallel, tc.groups, tc.split)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("slots (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPickEngine(t *testing.T) {
	for _, tc := range []struct {
		name  string
		loads []engineLoad
		want  int
	}{
		{name: "one", loads: []engineLoad{{slots: 4, jobs: 9}}, want: 0},
		{name: "both idle: the first", loads: []engineLoad{{2, 0}, {2, 0}}, want: 0},
		{name: "the one with a free slot", loads: []engineLoad{{2, 2}, {2, 1}}, want: 1},
		{name: "the most free slots", loads: []engineLoad{{2, 1}, {2, 0}}, want: 1},
		{name: "alternates as jobs arrive", loads: []engineLoad{{2, 1}, {2, 1}}, want: 0},
		{name: "all busy: the shortest queue", loads: []engineLoad{{2, 4}, {2, 3}}, want: 1},
		{name: "all busy, equal: the first", loads: []engineLoad{{2, 3}, {2, 3}}, want: 0},
		{name: "three", loads: []engineLoad{{2, 2}, {2, 2}, {2, 1}}, want: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pickEngine(tc.loads); got != tc.want {
				t.Errorf("pickEngine(%v) = %d, want %d", tc.loads, got, tc.want)
			}
		})
	}
}
