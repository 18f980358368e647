// Package engine is the engine settings of one model — its context, slots, KV cache
// type and CPU threads — in the one shape every layer shares: the ModelDeployment API
// (v1alpha1.EngineSpec embeds Settings), the standalone agent's configuration
// (`macfleet serve`), the agent's pool spec and the runner's command line. The bounds
// are the constants below (the CRD's validation rules repeat them; a test checks they
// agree), WithDefaults fills in what is unset, Validate says what is wrong, Args
// writes the runner's flags and RunnerFlags reads them back.
//
// A new knob touches this file (the field, its bound, its default, its flag) and the
// runner that obeys it; nothing between copies the fields.
//
// It is a ground-floor package: it imports no Kubernetes libraries, so the runner and
// the agent use it without pulling in the API machinery.
package engine

import (
	"errors"
	"fmt"
	"strconv"
)

// Bounds of the settings. The ModelDeployment CRD's validation rules (markers below)
// state the same numbers.
const (
	// MinContextLength and MaxContextLength bound ContextLength, the tokens of one
	// sequence (0 is "unset").
	MinContextLength = 256
	MaxContextLength = 1 << 20
	// DefaultContextLength is a deployment's context when it sets none. The
	// standalone agent instead gives an unset context the model's training context.
	DefaultContextLength = 4096
	// MinRunnerSlotContext is the fewest tokens a slot the runner itself accepts: the
	// runner is also started directly (tests with tiny models, benchmarks), below the
	// bound deployments and `macfleet serve` models are held to.
	MinRunnerSlotContext = 8

	// MinParallel and MaxParallel bound Parallel, the sequences decoded together.
	MinParallel     = 1
	MaxParallel     = 64
	DefaultParallel = 1

	// MaxThreads bounds Threads; 0 lets the agent's thread policy choose.
	MaxThreads = 256

	// DefaultBatch is the runner's n_batch when none is given.
	DefaultBatch = 512
	// MinSplitPipeline and MaxSplitPipeline bound SplitPipeline, the llama contexts a
	// split replica's head decodes at once (0 is "unset", which is 1).
	MinSplitPipeline = 1
	MaxSplitPipeline = 8
)

// KVCacheType is the element type of the KV cache.
// +kubebuilder:validation:Enum=f16;q8_0;q4_0
type KVCacheType string

// KV cache types.
const (
	KVCacheF16  KVCacheType = "f16"
	KVCacheQ8_0 KVCacheType = "q8_0"
	KVCacheQ4_0 KVCacheType = "q4_0"

	DefaultKVCacheType = KVCacheF16
)

// KVCacheTypes are the accepted KV cache types.
var KVCacheTypes = []KVCacheType{KVCacheF16, KVCacheQ8_0, KVCacheQ4_0}

// Settings are one model's engine settings. The zero value of every field means
// "unset": WithDefaults fills them in.
type Settings struct {
	// contextLength is the context of one sequence in tokens. The engine's KV cache
	// holds contextLength × parallel tokens, and the memory estimate counts them all.
	// +optional
	// +kubebuilder:default=4096
	// +kubebuilder:validation:XValidation:rule="self >= 256 && self <= 1048576",message="contextLength must be between 256 and 1048576 tokens"
	ContextLength int32 `json:"contextLength,omitempty"`

	// parallel is the number of sequences decoded together (continuous batching), each
	// with its own contextLength.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:XValidation:rule="self >= 1 && self <= 64",message="parallel must be between 1 and 64"
	Parallel int32 `json:"parallel,omitempty"`

	// kvCacheType is the KV cache element type.
	// +optional
	// +kubebuilder:default=f16
	KVCacheType KVCacheType `json:"kvCacheType,omitempty"`

	// threads is the CPU threads of each runner. Unset or 0: the Mac's agent chooses
	// (its --runner-threads, else its performance cores, and one thread for a model
	// under 32 MiB of weights).
	// +optional
	// +kubebuilder:validation:XValidation:rule="self >= 0 && self <= 256",message="threads must be between 0 (the agent chooses) and 256"
	Threads int32 `json:"threads,omitempty"`

	// splitPipeline is how many llama contexts the head of a replica split across
	// Macs (placement.maxMacsPerReplica above 1) decodes at once, each with
	// parallel/splitPipeline slots, so that the head computes its layers for one while
	// a worker computes its layers for another (docs/split-model.md, Pipelining).
	// parallel must be a multiple of it. A replica placed whole on one Mac ignores it.
	// Each context has its own compute buffers: the head's and every worker's
	// reservation grow by one compute buffer per context beyond the first. Unset or 1:
	// one context.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self >= 1 && self <= 8",message="splitPipeline must be between 1 (one context) and 8"
	SplitPipeline int32 `json:"splitPipeline,omitempty"`
}

// WithDefaults returns s with Parallel and KVCacheType filled in when unset.
// ContextLength is left alone: its default depends on who asks (DefaultContextLength
// for a deployment, the model's training context for `macfleet serve`), and Threads
// stays 0 for the agent's policy (Threads).
func (s Settings) WithDefaults() Settings {
	if s.Parallel == 0 {
		s.Parallel = DefaultParallel
	}
	if s.KVCacheType == "" {
		s.KVCacheType = DefaultKVCacheType
	}
	return s
}

// FieldError is one invalid setting.
type FieldError struct {
	// Field is the setting's JSON name ("parallel").
	Field string
	// Reason says what is wrong, with the value.
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Validate reports every setting out of bounds, one *FieldError each (joined with
// errors.Join; nil when all are valid). Zero values are valid: they mean "unset".
func (s Settings) Validate() error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	switch c := s.ContextLength; {
	case c < 0:
		add("contextLength", "%d is negative", c)
	case c > 0 && c < MinContextLength:
		add("contextLength", "%d is fewer than %d tokens per sequence", c, MinContextLength)
	case c > MaxContextLength:
		add("contextLength", "%d is more than %d tokens per sequence", c, MaxContextLength)
	}
	if p := s.Parallel; p != 0 && (p < MinParallel || p > MaxParallel) {
		add("parallel", "%d is not between %d and %d", p, MinParallel, MaxParallel)
	}
	if err := validKVCacheType(s.KVCacheType); s.KVCacheType != "" && err != nil {
		add("kvCacheType", "%v", err)
	}
	if t := s.Threads; t < 0 || t > MaxThreads {
		add("threads", "%d is not between 0 (the agent chooses) and %d", t, MaxThreads)
	}
	switch sp := s.SplitPipeline; {
	case sp != 0 && (sp < MinSplitPipeline || sp > MaxSplitPipeline):
		add("splitPipeline", "%d is not between %d and %d", sp, MinSplitPipeline, MaxSplitPipeline)
	case sp > 1 && s.Parallel != 0 && s.Parallel%sp != 0:
		add("splitPipeline", "parallel %d is not a multiple of %d", s.Parallel, sp)
	}
	return errors.Join(errs...)
}

func validKVCacheType(t KVCacheType) error {
	for _, k := range KVCacheTypes {
		if t == k {
			return nil
		}
	}
	return fmt.Errorf("%q is not one of f16, q8_0, q4_0", string(t))
}

// Pipeline is how many llama contexts a split head decodes at once: SplitPipeline,
// 1 when unset.
func (s Settings) Pipeline() int {
	return int(max(s.SplitPipeline, 1))
}

// SplitArgs are the engine flags only a split replica's head takes: --split-pipeline
// when above 1.
func (s Settings) SplitArgs() []string {
	if p := s.Pipeline(); p > 1 {
		return []string{"--split-pipeline", strconv.Itoa(p)}
	}
	return nil
}

// TotalContext is the engine's whole KV cache in tokens: ContextLength × Parallel
// (0 when ContextLength is unset: the runner then gives every slot the model's
// training context).
func (s Settings) TotalContext() int {
	return int(s.ContextLength) * int(max(s.Parallel, 1))
}

// Args are the runner's engine flags for s: --ctx (the total context), --parallel,
// --threads, --batch (batch is n_batch, an agent-wide setting; 0 leaves it to the
// runner) and --kv-type, each only when set. SplitPipeline is not among them: it is a
// split head's flag alone (SplitArgs).
func (s Settings) Args(batch int) []string {
	var args []string
	add := func(flag string, v int) {
		if v > 0 {
			args = append(args, flag, strconv.Itoa(v))
		}
	}
	add("--ctx", s.TotalContext())
	add("--parallel", int(s.Parallel))
	add("--threads", int(s.Threads))
	add("--batch", batch)
	if s.KVCacheType != "" {
		args = append(args, "--kv-type", string(s.KVCacheType))
	}
	return args
}
