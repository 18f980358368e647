package main

import (
	"flag"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

func TestIntList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want intList
		bad  bool
	}{
		{in: "4", want: intList{4}},
		{in: "64,1, 16,4,4", want: intList{1, 4, 16, 64}},
		{in: "2048,8192", want: intList{2048, 8192}},
		{in: "0", bad: true},
		{in: "4,x", bad: true},
		{in: "", bad: true},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		l := intList{7}
		fs.Var(&l, "l", "")
		err := fs.Parse([]string{"-l", tc.in})
		if tc.bad != (err != nil) {
			t.Errorf("-l %q: error %v, want one: %v", tc.in, err, tc.bad)
			continue
		}
		if !tc.bad && !cmp.Equal(l, tc.want) {
			t.Errorf("-l %q = %v, want %v", tc.in, l, tc.want)
		}
	}
}

// TestSetups: by default one set of servers with today's jobs in today's order (so a
// seed repeats a run of before); with -long-ctx the long prompts apart, on the matched
// servers alone, one slot each.
func TestSetups(t *testing.T) {
	o := options{streams: intList{4}, long: intList{2000}, ctx: 1024, parallel: 4, defaults: true}
	want := []setup{{ctx: 1024, parallel: 4, defaults: true, jobs: []string{"decode1", "streams4", "ttftShort", "ttftLong0", "cold"}}}
	if d := cmp.Diff(want, o.setups(), cmp.AllowUnexported(setup{})); d != "" {
		t.Errorf("default setups (-want +got):\n%s", d)
	}
	if got := o.longTokens(); !cmp.Equal(got, []int{992}) {
		t.Errorf("long tokens at ctx 1024 = %v, want [992]", got)
	}

	o.streams, o.long, o.longCtx, o.parallel = intList{1, 4, 16, 64}, intList{2048, 8192}, 8448, 64
	want = []setup{
		{ctx: 1024, parallel: 64, defaults: true, jobs: []string{"decode1", "streams1", "streams4", "streams16", "streams64",
			"ttftShort", "cold"}, defaultsJobs: []string{"ttftLong0", "ttftLong1"}},
		{name: "long", ctx: 8448, parallel: 1, jobs: []string{"ttftLong0", "ttftLong1"}},
	}
	if d := cmp.Diff(want, o.setups(), cmp.AllowUnexported(setup{})); d != "" {
		t.Errorf("setups with -long-ctx (-want +got):\n%s", d)
	}
	if got := o.longTokens(); !cmp.Equal(got, []int{2048, 8192}) {
		t.Errorf("long tokens at -long-ctx 8448 = %v, want [2048 8192]", got)
	}
	o.defaults = false
	if got := o.setups()[0]; got.defaultsJobs != nil {
		t.Errorf("without the servers at their defaults the first set measures long prompts: %v", got.defaultsJobs)
	}
}

func TestTasks(t *testing.T) {
	all := []string{"macfleet", "peer", "macfleet-defaults", "peer-defaults"}
	st := setup{jobs: []string{"decode1", "streams16", "cold"}, defaultsJobs: []string{"ttftLong0"}}
	want := []task{
		{"macfleet", "decode1"}, {"peer", "decode1"}, {"macfleet-defaults", "decode1"}, {"peer-defaults", "decode1"},
		{"macfleet", "streams16"}, {"peer", "streams16"},
		{"macfleet", "cold"}, {"peer", "cold"}, {"macfleet-defaults", "cold"}, {"peer-defaults", "cold"},
		{"macfleet-defaults", "ttftLong0"}, {"peer-defaults", "ttftLong0"},
	}
	if d := cmp.Diff(want, st.tasks(all), cmp.AllowUnexported(task{})); d != "" {
		t.Errorf("tasks (-want +got):\n%s", d)
	}
}

func TestMeasures(t *testing.T) {
	for _, tc := range []struct {
		subject, job string
		want         bool
	}{
		{"macfleet", "streams64", true},
		{"peer", "streams16", true},
		{"peer-defaults", "streams4", true},
		{"peer-defaults", "streams16", false},
		{"macfleet-defaults", "streams64", false},
		{"macfleet-defaults", "ttftLong1", true},
		{"peer-defaults", "decode1", true},
	} {
		if got := measures(tc.subject, tc.job); got != tc.want {
			t.Errorf("measures(%s, %s) = %v, want %v", tc.subject, tc.job, got, tc.want)
		}
	}
}

func TestCheck(t *testing.T) {
	bin := filepath.Join(t.TempDir())
	ok := options{macfleet: bin, runner: bin, peer: bin, rounds: 3, maxTokens: 128, parallel: 4, ctx: 1024,
		streams: intList{4}, long: intList{2000}}
	if err := ok.check(); err != nil {
		t.Fatalf("check of today's defaults: %v", err)
	}
	for name, mod := range map[string]func(o *options){
		"more streams than slots": func(o *options) { o.streams = intList{4, 16} },
		"no streams":              func(o *options) { o.streams = nil },
		"a small long context":    func(o *options) { o.longCtx = 100 },
		"no bandwidth":            func(o *options) { o.gpu, o.hbm = true, 0 },
	} {
		o := ok
		mod(&o)
		if o.check() == nil {
			t.Errorf("check accepted %s", name)
		}
	}
}

// TestStepBytes: an untied model's decode step reads every tensor but the embedding,
// of which one row; a tied one reads its embedding whole (the output projection).
func TestStepBytes(t *testing.T) {
	for _, untied := range []bool{false, true} {
		spec := ggufsynth.Tiny()
		spec.DType, spec.Untied = ggufsynth.Q8_0, untied
		path := filepath.Join(t.TempDir(), "m.gguf")
		if err := ggufsynth.Write(path, spec); err != nil {
			t.Fatal(err)
		}
		step, total, err := stepBytes(path)
		if err != nil {
			t.Fatal(err)
		}
		e, v, l := float64(spec.Embd), float64(spec.Vocab), float64(spec.Layers)
		matrix := func(rows, cols float64) float64 { return rows * cols / 32 * 34 }
		layer := matrix(e, e)*2 + matrix(e, float64(spec.EmbdKV()))*2 + matrix(e, float64(spec.FF))*3 + 4*2*e
		wantTotal := matrix(v, e) + 4*e + l*layer
		wantStep := wantTotal
		if untied {
			wantTotal += matrix(v, e)
			wantStep = wantTotal - matrix(v, e) + matrix(1, e)
		}
		if total != wantTotal || step != wantStep {
			t.Errorf("untied %v: step %v, total %v; want %v, %v", untied, step, total, wantStep, wantTotal)
		}
	}
}
