package engine

// SmallModelBytes is the weight size under which a runner gets one thread: there
// ggml's thread synchronisation (spinning barriers at every step) costs more than the
// work it shares out.
const SmallModelBytes = 32 << 20

// PolicyThreads is the thread policy: the threads a runner gets when neither its
// deployment nor its agent says. performanceCores are the Mac's performance cores
// (Linux: its physical cores); weightBytes are the model's weights.
//
// Every performance core, because decode is bound by memory bandwidth and compute in
// turns, and more threads helped at every slot count measured (on a 2-core host, a
// 184 MB f16 model decoded 54 tok/s on one thread and 76 on two for one stream, 126
// and 215 over four streams), so the slots do not lower it. Efficiency cores are left
// out: a step waits for its slowest thread. A model under SmallModelBytes gets one
// thread. Never below 1; 0 cores (unknown) gives 0, which leaves the runner's own
// default in place.
func PolicyThreads(performanceCores int, weightBytes int64) int {
	switch {
	case performanceCores <= 0:
		return 0
	case weightBytes > 0 && weightBytes < SmallModelBytes:
		return 1
	}
	return min(performanceCores, MaxThreads)
}

// Threads is the precedence of a runner's threads: the deployment's (or serve
// model's) engine.threads, else the agent's node-wide setting (--runner-threads,
// runnerThreads), else the policy's choice. 0 from all three leaves the runner's own
// default (CPUs − 1).
func Threads(model, node int32, policy int) int {
	switch {
	case model > 0:
		return int(model)
	case node > 0:
		return int(node)
	}
	return max(policy, 0)
}

// WithRunnerThreads is s as a runner runs it: Threads by the precedence of Threads —
// s's own, else the agent's nodeThreads, else the thread policy for the Mac's
// performanceCores and the model's weightBytes (PolicyThreads).
func (s Settings) WithRunnerThreads(nodeThreads, performanceCores int, weightBytes int64) Settings {
	s.Threads = int32(Threads(s.Threads, int32(nodeThreads), PolicyThreads(performanceCores, weightBytes)))
	return s
}

// OffloadedThreads is the most CPU threads a runner gives llama.cpp when every layer
// of its model computes on an accelerator (Metal, CUDA): the CPU then only looks up
// the input tokens' embeddings, and more threads only spin at ggml's barriers beside
// the runner's own sampling. On an H200, a 30B-A3B mixture of experts at 16 streams
// (sampled) decoded 645–657 tok/s with 15 threads and 687–689 with 2
// (docs/benchmarks.md).
const OffloadedThreads = 2

// StepThreads are the threads a runner's contexts use: requested, or at most
// OffloadedThreads when every layer is offloaded to an accelerator. A split runner
// keeps requested (its head's layers may compute on the CPU while a worker computes).
func StepThreads(requested int, allOffloaded bool) int {
	if allOffloaded && requested > OffloadedThreads {
		return OffloadedThreads
	}
	return requested
}
