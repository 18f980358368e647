package server

import (
	"fmt"
	"time"
)

// Where a draft model computes (--draft-device, docs/speculative-decoding.md). A draft
// drafts one token at a time, so its step is what it costs; on an accelerator a small
// model's step is bound by launching its kernels and copying its row of logits back,
// not by its weights (the trained test draft's step on an H200 cost about what its
// target's did), while on the host's idle cores its greedy head scans the vocabulary
// in a fraction of that. Left to the runner (auto), a draft beside a model on an
// accelerator is timed on both and computes where its step was shorter.

// DraftDevice is where a draft model computes.
type DraftDevice string

const (
	// DraftDeviceAuto: beside a model on an accelerator, where the draft's step was
	// shorter at load (both timed); else the CPU, as the model.
	DraftDeviceAuto DraftDevice = "auto"
	// DraftDeviceCPU: the CPU, whatever the model's device (with its greedy head where
	// its output matrix is q8_0).
	DraftDeviceCPU DraftDevice = "cpu"
	// DraftDeviceGPU: the model's accelerator; refused where the model has none.
	DraftDeviceGPU DraftDevice = "gpu"
)

// ParseDraftDevice checks a --draft-device value ("" is auto).
func ParseDraftDevice(s string) (DraftDevice, error) {
	switch d := DraftDevice(s); d {
	case "":
		return DraftDeviceAuto, nil
	case DraftDeviceAuto, DraftDeviceCPU, DraftDeviceGPU:
		return d, nil
	}
	return "", fmt.Errorf("--draft-device %q: want auto, cpu or gpu", s)
}

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
func placeDraft(choice DraftDevice, accel bool, t draftTimes) (draftPlan, error) {
	switch {
	case choice == DraftDeviceGPU && !accel:
		return draftPlan{}, fmt.Errorf("--draft-device gpu: the model is not on an accelerator " +
			"(no GPU backend was loaded, or --gpu-layers is 0); use auto or cpu")
	case choice == DraftDeviceGPU:
		return draftPlan{Why: "asked (--draft-device gpu)"}, nil
	case choice == DraftDeviceCPU:
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
