package engine

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
)

func TestWithDefaults(t *testing.T) {
	tests := []struct {
		name string
		in   Settings
		want Settings
	}{
		{name: "unset", want: Settings{Parallel: 1, KVCacheType: KVCacheF16}},
		{name: "set stays", in: Settings{ContextLength: 8192, Parallel: 4, KVCacheType: KVCacheQ8_0, Threads: 3},
			want: Settings{ContextLength: 8192, Parallel: 4, KVCacheType: KVCacheQ8_0, Threads: 3}},
		{name: "context and threads stay unset", in: Settings{Parallel: 2},
			want: Settings{Parallel: 2, KVCacheType: KVCacheF16}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := cmp.Diff(tt.want, tt.in.WithDefaults()); d != "" {
				t.Errorf("WithDefaults (-want +got):\n%s", d)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		in   Settings
		want []string // fields, in order
	}{
		{name: "unset is valid"},
		{name: "bounds are inclusive", in: Settings{ContextLength: MinContextLength, Parallel: MaxParallel, KVCacheType: KVCacheQ4_0, Threads: MaxThreads}},
		{name: "largest context", in: Settings{ContextLength: MaxContextLength, Parallel: MinParallel}},
		{name: "context too short", in: Settings{ContextLength: MinContextLength - 1}, want: []string{"contextLength"}},
		{name: "context too long", in: Settings{ContextLength: MaxContextLength + 1}, want: []string{"contextLength"}},
		{name: "negative context", in: Settings{ContextLength: -5}, want: []string{"contextLength"}},
		{name: "too many slots", in: Settings{Parallel: MaxParallel + 1}, want: []string{"parallel"}},
		{name: "negative slots", in: Settings{Parallel: -1}, want: []string{"parallel"}},
		{name: "unknown kv type", in: Settings{KVCacheType: "f32"}, want: []string{"kvCacheType"}},
		{name: "too many threads", in: Settings{Threads: MaxThreads + 1}, want: []string{"threads"}},
		{name: "negative threads", in: Settings{Threads: -1}, want: []string{"threads"}},
		{name: "split pipeline bounds are inclusive", in: Settings{Parallel: 8, SplitPipeline: MaxSplitPipeline}},
		{name: "split pipeline too deep", in: Settings{Parallel: 16, SplitPipeline: MaxSplitPipeline + 1}, want: []string{"splitPipeline"}},
		{name: "negative split pipeline", in: Settings{SplitPipeline: -1}, want: []string{"splitPipeline"}},
		{name: "slots not a multiple of the split pipeline", in: Settings{Parallel: 3, SplitPipeline: 2}, want: []string{"splitPipeline"}},
		{name: "all at once", in: Settings{ContextLength: 8, Parallel: 65, KVCacheType: "x", Threads: -2},
			want: []string{"contextLength", "parallel", "kvCacheType", "threads"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.in.Validate()
			var got []string
			if err != nil {
				for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
					var fe *FieldError
					if !errors.As(e, &fe) {
						t.Fatalf("error %T %v is not a *FieldError", e, e)
					}
					if !strings.HasPrefix(fe.Error(), fe.Field+": ") || fe.Reason == "" {
						t.Errorf("error %q does not name its field and reason", fe)
					}
					got = append(got, fe.Field)
				}
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("invalid fields (-want +got):\n%s\n%v", d, err)
			}
		})
	}
}

func TestArgs(t *testing.T) {
	tests := []struct {
		name  string
		in    Settings
		batch int
		want  []string
	}{
		{name: "unset writes nothing"},
		{name: "context is the total", in: Settings{ContextLength: 1024, Parallel: 4},
			want: []string{"--ctx", "4096", "--parallel", "4"}},
		{name: "context with one slot", in: Settings{ContextLength: 512},
			want: []string{"--ctx", "512"}},
		{name: "everything", in: Settings{ContextLength: 256, Parallel: 2, KVCacheType: KVCacheQ8_0, Threads: 3}, batch: 64,
			want: []string{"--ctx", "512", "--parallel", "2", "--threads", "3", "--batch", "64", "--kv-type", "q8_0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := cmp.Diff(tt.want, tt.in.Args(tt.batch)); d != "" {
				t.Errorf("Args (-want +got):\n%s", d)
			}
		})
	}
}

// TestSplitArgs: Args never writes the split pipeline (a whole replica's runner
// refuses it); SplitArgs writes it for a split head only when above 1.
func TestSplitArgs(t *testing.T) {
	for _, tc := range []struct {
		pipeline int32
		want     []string
	}{{0, nil}, {1, nil}, {2, []string{"--split-pipeline", "2"}}, {8, []string{"--split-pipeline", "8"}}} {
		s := Settings{Parallel: 8, SplitPipeline: tc.pipeline}
		if d := cmp.Diff(tc.want, s.SplitArgs()); d != "" {
			t.Errorf("SplitPipeline %d: SplitArgs (-want +got):\n%s", tc.pipeline, d)
		}
		if args := s.Args(0); slices.Contains(args, "--split-pipeline") {
			t.Errorf("SplitPipeline %d: Args wrote %q", tc.pipeline, args)
		}
	}
}

// TestRunnerFlagsReadArgs: what Args writes, the runner's flags read back, and the
// runner's own bounds refuse what is out of them.
func TestRunnerFlagsReadArgs(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    Runner
		wantErr string
	}{
		{name: "defaults", want: Runner{Parallel: 1, Batch: DefaultBatch, Threads: 7, KVType: "f16"}},
		{name: "from Args", args: Settings{ContextLength: 256, Parallel: 2, KVCacheType: KVCacheQ4_0, Threads: 3}.Args(64),
			want: Runner{Ctx: 512, Parallel: 2, Batch: 64, Threads: 3, KVType: "q4_0"}},
		{name: "small slots for tests", args: []string{"--ctx", "256", "--parallel", "2"},
			want: Runner{Ctx: 256, Parallel: 2, Batch: DefaultBatch, Threads: 7, KVType: "f16"}},
		{name: "too many slots", args: []string{"--parallel", "65"}, wantErr: "--parallel must be between 1 and 64, got 65"},
		{name: "batch below slots", args: []string{"--parallel", "8", "--batch", "4"}, wantErr: "--batch 4 must be at least --parallel 8"},
		{name: "negative context", args: []string{"--ctx", "-1"}, wantErr: "--ctx must not be negative"},
		{name: "tiny slots", args: []string{"--ctx", "15", "--parallel", "2"}, wantErr: "fewer than 8 tokens per slot"},
		{name: "huge slot", args: []string{"--ctx", "1048577"}, wantErr: "more than 1048576 tokens"},
		{name: "no threads", args: []string{"--threads", "0"}, wantErr: "--threads must be between 1 and 256, got 0"},
		{name: "unknown kv type", args: []string{"--kv-type", "f32"}, wantErr: `--kv-type: "f32" is not one of`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("runner", pflag.ContinueOnError)
			fs.SetOutput(io.Discard)
			f := BindRunnerFlags(fs, 7)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			got, err := f.Runner()
			switch {
			case tt.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v; want one containing %q", err, tt.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			default:
				if d := cmp.Diff(tt.want, got); d != "" {
					t.Errorf("Runner (-want +got):\n%s", d)
				}
			}
		})
	}
}

func TestPolicyThreads(t *testing.T) {
	tests := []struct {
		name    string
		cores   int
		weights int64
		want    int
	}{
		{name: "every performance core", cores: 8, weights: 4 << 30, want: 8},
		{name: "the measured 2-core host and mid model", cores: 2, weights: 184 << 20, want: 2},
		{name: "a model under 32 MiB gets one thread", cores: 12, weights: SmallModelBytes - 1, want: 1},
		{name: "a model of exactly 32 MiB does not", cores: 12, weights: SmallModelBytes, want: 12},
		{name: "unknown weights count as large", cores: 4, want: 4},
		{name: "one core", cores: 1, weights: 4 << 30, want: 1},
		{name: "unknown cores leave the runner's default", cores: 0, weights: 4 << 30, want: 0},
		{name: "capped at the bound", cores: 1000, weights: 4 << 30, want: MaxThreads},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := PolicyThreads(tt.cores, tt.weights); got != tt.want {
				t.Errorf("PolicyThreads(%d, %d) = %d, want %d", tt.cores, tt.weights, got, tt.want)
			}
		})
	}
}

func TestThreadsPrecedence(t *testing.T) {
	tests := []struct {
		name          string
		model, node   int32
		policy, wantN int
	}{
		{name: "the deployment wins", model: 3, node: 1, policy: 8, wantN: 3},
		{name: "then the agent", node: 1, policy: 8, wantN: 1},
		{name: "then the policy", policy: 8, wantN: 8},
		{name: "nothing: the runner's default", wantN: 0},
		{name: "a negative policy is nothing", policy: -1, wantN: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Threads(tt.model, tt.node, tt.policy); got != tt.wantN {
				t.Errorf("Threads(%d, %d, %d) = %d, want %d", tt.model, tt.node, tt.policy, got, tt.wantN)
			}
		})
	}
}

// TestWithRunnerThreads: only Threads changes, by the precedence model > agent >
// policy, the policy reading the cores and the model's weights.
func TestWithRunnerThreads(t *testing.T) {
	big := Settings{ContextLength: 1024, Parallel: 2, KVCacheType: KVCacheQ8_0}
	withThreads := big
	withThreads.Threads = 3
	tests := []struct {
		name        string
		s           Settings
		node, cores int
		weights     int64
		wantThreads int32
	}{
		{name: "nothing known: the runner chooses", s: big, weights: 4 << 30, wantThreads: 0},
		{name: "the policy: every performance core", s: big, cores: 8, weights: 4 << 30, wantThreads: 8},
		{name: "the policy: a small model gets one thread", s: big, cores: 8, weights: 16 << 20, wantThreads: 1},
		{name: "the agent's threads beat the policy", s: big, node: 1, cores: 8, weights: 4 << 30, wantThreads: 1},
		{name: "the model's threads beat the agent's", s: withThreads, node: 1, cores: 8, weights: 4 << 30, wantThreads: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.s
			want.Threads = tt.wantThreads
			if d := cmp.Diff(want, tt.s.WithRunnerThreads(tt.node, tt.cores, tt.weights)); d != "" {
				t.Errorf("WithRunnerThreads(%d, %d, %d) (-want +got):\n%s", tt.node, tt.cores, tt.weights, d)
			}
		})
	}
}

func TestStepThreads(t *testing.T) {
	for _, tc := range []struct {
		name      string
		requested int
		offloaded bool
		want      int
	}{
		{name: "on the CPU every requested thread", requested: 15, want: 15},
		{name: "offloaded: capped", requested: 15, offloaded: true, want: OffloadedThreads},
		{name: "offloaded: fewer stay", requested: 1, offloaded: true, want: 1},
		{name: "offloaded: at the cap", requested: OffloadedThreads, offloaded: true, want: OffloadedThreads},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := StepThreads(tc.requested, tc.offloaded); got != tc.want {
				t.Errorf("StepThreads(%d, %v) = %d, want %d", tc.requested, tc.offloaded, got, tc.want)
			}
		})
	}
}
