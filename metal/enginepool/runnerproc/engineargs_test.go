package runnerproc

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/api/engine"
	"github.com/macfleet/macfleet/metal/enginepool"
)

// TestEngineArgs: the runner's engine flags come from the spec's engine settings, with
// the threads of the precedence model > agent (ProcessConfig.Threads) > thread policy
// (ProcessConfig.PerformanceCores and the model's weights).
func TestEngineArgs(t *testing.T) {
	big := enginepool.ModelSpec{Name: "m", Engine: engine.Settings{ContextLength: 1024, Parallel: 2, KVCacheType: "q8_0"}, WeightBytes: 4 << 30}
	withThreads := big
	withThreads.Engine.Threads = 3
	small := big
	small.WeightBytes = 16 << 20
	tests := []struct {
		name    string
		cfg     ProcessConfig
		spec    enginepool.ModelSpec
		ceiling int64
		want    []string
	}{
		{name: "no policy: the runner chooses", spec: big,
			want: []string{"--ctx", "2048", "--parallel", "2", "--kv-type", "q8_0", "--alias", "m"}},
		{name: "the policy: every performance core", cfg: ProcessConfig{PerformanceCores: 8}, spec: big, ceiling: 1 << 30,
			want: []string{"--ctx", "2048", "--parallel", "2", "--threads", "8", "--kv-type", "q8_0", "--ceiling-bytes", "1073741824", "--alias", "m"}},
		{name: "the policy: a small model gets one thread", cfg: ProcessConfig{PerformanceCores: 8}, spec: small,
			want: []string{"--ctx", "2048", "--parallel", "2", "--threads", "1", "--kv-type", "q8_0", "--alias", "m"}},
		{name: "the agent's threads beat the policy", cfg: ProcessConfig{Threads: 1, PerformanceCores: 8, Batch: 64}, spec: big,
			want: []string{"--ctx", "2048", "--parallel", "2", "--threads", "1", "--batch", "64", "--kv-type", "q8_0", "--alias", "m"}},
		{name: "the model's threads beat the agent's", cfg: ProcessConfig{Threads: 1, PerformanceCores: 8, Args: []string{"-v"}}, spec: withThreads,
			want: []string{"--ctx", "2048", "--parallel", "2", "--threads", "3", "--kv-type", "q8_0", "--alias", "m", "-v"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := NewProcessFactory(tt.cfg)
			if d := cmp.Diff(tt.want, f.engineArgs(tt.spec, tt.ceiling)); d != "" {
				t.Errorf("engineArgs (-want +got):\n%s", d)
			}
		})
	}
}
