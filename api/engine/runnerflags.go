package engine

import (
	"fmt"
)

// FlagSet is what RunnerFlags registers on; pflag.FlagSet and the standard library's
// flag.FlagSet both satisfy it, so this package needs neither.
type FlagSet interface {
	IntVar(p *int, name string, value int, usage string)
	StringVar(p *string, name string, value string, usage string)
}

// RunnerFlags are the runner's engine flags (the ones Args writes), registered on a
// flag set by BindRunnerFlags and read back by Settings.
type RunnerFlags struct {
	ctx, parallel, threads, batch int
	kvType                        string
}

// BindRunnerFlags registers --ctx, --parallel, --batch, --threads and --kv-type on
// fs. defaultThreads is what --threads is when not given.
func BindRunnerFlags(fs FlagSet, defaultThreads int) *RunnerFlags {
	f := &RunnerFlags{}
	fs.IntVar(&f.ctx, "ctx", 0, "total context in tokens across all slots (0: the model's training context per slot)")
	fs.IntVar(&f.parallel, "parallel", DefaultParallel, "slots: sequences decoded together")
	fs.IntVar(&f.batch, "batch", DefaultBatch, "most tokens decoded per step (n_batch)")
	fs.IntVar(&f.threads, "threads", defaultThreads, "CPU threads")
	fs.StringVar(&f.kvType, "kv-type", string(DefaultKVCacheType), "KV cache type: f16, q8_0 or q4_0")
	return f
}

// Runner is the engine settings as the runner runs them.
type Runner struct {
	// Ctx is the total context in tokens across the slots; zero gives every slot the
	// model's training context.
	Ctx      int
	Parallel int
	// Batch is n_batch: the most tokens decoded in one step.
	Batch   int
	Threads int
	KVType  string
}

// Runner checks the parsed flags against the bounds (a slot may hold as few as
// MinRunnerSlotContext tokens: see there) and returns them.
func (f *RunnerFlags) Runner() (Runner, error) {
	r := Runner{Ctx: f.ctx, Parallel: f.parallel, Batch: f.batch, Threads: f.threads, KVType: f.kvType}
	switch {
	case r.Parallel < MinParallel || r.Parallel > MaxParallel:
		return r, fmt.Errorf("--parallel must be between %d and %d, got %d", MinParallel, MaxParallel, r.Parallel)
	case r.Batch < r.Parallel:
		return r, fmt.Errorf("--batch %d must be at least --parallel %d", r.Batch, r.Parallel)
	case r.Ctx < 0:
		return r, fmt.Errorf("--ctx must not be negative, got %d", r.Ctx)
	case r.Ctx > 0 && r.Ctx < r.Parallel*MinRunnerSlotContext:
		return r, fmt.Errorf("--ctx %d leaves fewer than %d tokens per slot", r.Ctx, MinRunnerSlotContext)
	case r.Ctx > r.Parallel*MaxContextLength:
		return r, fmt.Errorf("--ctx %d gives a slot more than %d tokens", r.Ctx, MaxContextLength)
	case r.Threads < 1 || r.Threads > MaxThreads:
		return r, fmt.Errorf("--threads must be between 1 and %d, got %d", MaxThreads, r.Threads)
	}
	if err := validKVCacheType(KVCacheType(r.KVType)); err != nil {
		return r, fmt.Errorf("--kv-type: %w", err)
	}
	return r, nil
}
