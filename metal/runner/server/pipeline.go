package server

import "fmt"

// Pipelining a split model (docs/split-model.md, "Pipelining"): the runner decodes its
// slots in several llama contexts on the one model, each on its own goroutine, so that
// while one context's step is on a worker the runner computes another's. These are
// the decisions; engine_set.go and server.go apply them.

// pipelineSlots divides parallel slots among groups contexts. Every context gets as
// many: a sequence state saved from one is restored into another (the prompt cache,
// whose identity names the stream count), and llama.cpp refuses a state of another
// stream count.
func pipelineSlots(parallel, groups int, split bool) ([]int, error) {
	switch {
	case groups < 1:
		return nil, fmt.Errorf("the split pipeline must have at least one context, got %d", groups)
	case groups == 1:
		return []int{parallel}, nil
	case !split:
		return nil, fmt.Errorf("a split pipeline of %d contexts needs split workers: without them the runner computes every stage itself", groups)
	case parallel%groups != 0:
		return nil, fmt.Errorf("a split pipeline of %d contexts needs the slots (%d) to be a multiple of it", groups, parallel)
	}
	out := make([]int, groups)
	for i := range out {
		out[i] = parallel / groups
	}
	return out, nil
}

// engineLoad is one context's engine as pickEngine sees it: its slots and the jobs it
// holds (queued or in a slot).
type engineLoad struct{ slots, jobs int }

// pickEngine chooses the engine a new job joins: the one with the most free slots
// (a job never queues on one engine while another has a slot free), else the one with
// the shortest queue relative to its slots; ties go to the first.
func pickEngine(loads []engineLoad) int {
	best := 0
	for i, l := range loads[1:] {
		b := loads[best]
		if l.slots-l.jobs > b.slots-b.jobs {
			best = i + 1
		}
	}
	return best
}
