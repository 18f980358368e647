//go:build cgo && !race

package server

import (
	"fmt"
	"time"

	"github.com/macfleet/macfleet/metal/runner/netdevice"
)

// Where a draft model computes (--draft-device, docs/speculative-decoding.md). A draft
// drafts one token at a time, so its step is what it costs; on an accelerator a small
// model's step is bound by launching its kernels and copying its row of logits back,
// not by its weights (the trained test draft's step on an H200 cost about what its
// target's did), while on the host's idle cores its greedy head scans the vocabulary
// in a fraction of that. Left to the runner (netdevice.DeviceAuto), a draft beside a
// model on an accelerator is timed on both and computes where its step was shorter;
// DeviceCPU puts it on the CPU (with its greedy head where its output matrix is q8_0),
// DeviceGPU on the model's accelerator, refused where the model has none.

// draftTimes is a draft's one-token step (its greedy choice included) as timed at
// load on each device tried; zero where it was not tried.
type draftTimes struct {
	CPU, Accel time.Duration
}

// draftPlan is placeDraft's decision.
type draftPlan struct {
	// OnCPU: the draft computes on the CPU (else on the model's accelerator).
	OnCPU bool
	// Measure: time the draft on both devices first and call placeDraft again with
	// the times.
	Measure bool
	// Why says how the device was chosen, for the log and /status.
	Why string
}

// placeDraft decides where a draft computes: choice is --draft-device, accel whether
// the model's layers are on an accelerator, t the times measured so far (zero before
// any). An error names a choice that cannot be met.
func placeDraft(choice netdevice.DeviceChoice, accel bool, t draftTimes) (draftPlan, error) {
	switch {
	case choice == netdevice.DeviceGPU && !accel:
		return draftPlan{}, fmt.Errorf("--draft-device gpu: the model is not on an accelerator " +
			"(no GPU backend was loaded, or --gpu-layers is 0); use auto or cpu")
	case choice == netdevice.DeviceGPU:
		return draftPlan{Why: "asked (--draft-device gpu)"}, nil
	case choice == netdevice.DeviceCPU:
		return draftPlan{OnCPU: true, Why: "asked (--draft-device cpu)"}, nil
	case !accel:
		return draftPlan{OnCPU: true, Why: "the model is on the CPU"}, nil
	case t.CPU <= 0 || t.Accel <= 0:
		return draftPlan{Measure: true}, nil
	case t.CPU < t.Accel:
		return draftPlan{OnCPU: true, Why: fmt.Sprintf("measured: a step took %s on the CPU, %s on the accelerator",
			roundStep(t.CPU), roundStep(t.Accel))}, nil
	}
	return draftPlan{Why: fmt.Sprintf("measured: a step took %s on the accelerator, %s on the CPU",
		roundStep(t.Accel), roundStep(t.CPU))}, nil
}

// roundStep is d to the microsecond.
func roundStep(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
