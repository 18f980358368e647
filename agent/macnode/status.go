package macnode

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/agent/hardware"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/bytesize"
)

const gib = int64(1) << 30

// maxLabelValue is the longest label value the API server accepts.
const maxLabelValue = 63

// Labels are the well-known labels the agent sets on its MacNode: the chip
// (ChipLabelValue), the unified memory in whole GiB, the architecture and the OS.
// Labels whose value is unknown are left out.
func Labels(hw hardware.Info) map[string]string {
	l := map[string]string{}
	if v := ChipLabelValue(hw.Chip); v != "" {
		l[v1alpha1.LabelChip] = v
	}
	if hw.UnifiedMemoryBytes > 0 {
		l[v1alpha1.LabelMemoryGiB] = strconv.FormatInt(int64(math.Round(float64(hw.UnifiedMemoryBytes)/float64(gib))), 10)
	}
	if hw.Arch != "" {
		l[corev1.LabelArchStable] = hw.Arch
	}
	if hw.OS != "" {
		l[corev1.LabelOSStable] = hw.OS
	}
	return l
}

// ChipLabelValue turns a chip name into a label value: every run of characters a label
// value cannot hold becomes one '-', and the result starts and ends with a letter or
// digit and is at most 63 characters long ("Apple M2 Max" → "Apple-M2-Max").
func ChipLabelValue(chip string) string {
	var b strings.Builder
	dash := false
	for _, r := range chip {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_':
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(r)
		default:
			dash = true
		}
	}
	v := b.String()
	v = v[:min(len(v), maxLabelValue)]
	return strings.TrimFunc(v, func(r rune) bool { return !isAlnum(r) })
}

func isAlnum(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}

// statusInputs is everything the agent writes into its MacNode's status.
type statusInputs struct {
	hardware hardware.Info
	version  string
	address  string
	// memory is nil when the session has no MemorySource.
	memory *Memory
	// ready is the Ready condition's status, reason and message.
	ready        metav1.ConditionStatus
	readyReason  string
	readyMessage string
}

// applyStatus sets the parts of node's status the agent owns — hardware, agent,
// memory, and the Ready and MemoryPressure conditions — leaving any other condition
// as it is. A condition's lastTransitionTime becomes now only when its status changes.
func applyStatus(node *v1alpha1.MacNode, in statusInputs, now time.Time) {
	node.Status.Hardware = hardwareStatus(in.hardware)
	node.Status.Agent = v1alpha1.AgentStatus{Version: in.version, Address: in.address}
	ltt := metav1.NewTime(now).Rfc3339Copy()
	meta.SetStatusCondition(&node.Status.Conditions, metav1.Condition{
		Type: v1alpha1.MacNodeReady, Status: in.ready, ObservedGeneration: node.Generation,
		LastTransitionTime: ltt, Reason: in.readyReason, Message: in.readyMessage,
	})
	if in.memory == nil {
		return
	}
	node.Status.Memory = memoryStatus(*in.memory)
	node.Status.Display = &v1alpha1.MemoryDisplay{Ceiling: bytesize.Quantity(node.Status.Memory.Ceiling),
		Used: bytesize.Quantity(node.Status.Memory.Used), Committed: bytesize.Quantity(node.Status.Memory.Committed)}
	status, reason, message := pressureCondition(*in.memory)
	meta.SetStatusCondition(&node.Status.Conditions, metav1.Condition{
		Type: v1alpha1.MacNodeMemoryPressure, Status: status, ObservedGeneration: node.Generation,
		LastTransitionTime: ltt, Reason: reason, Message: message,
	})
}

// hardwareStatus is the status form of hw; unknown figures are left out.
func hardwareStatus(hw hardware.Info) v1alpha1.HardwareStatus {
	return v1alpha1.HardwareStatus{
		Chip: truncate(hw.Chip, 128), CPUCores: int32(hw.CPUCores), GPUCores: int32(hw.GPUCores),
		PerformanceCores: int32(hw.PerformanceCores),
		UnifiedMemory:    bytesQuantity(hw.UnifiedMemoryBytes), MetalWorkingSet: bytesQuantity(hw.MetalWorkingSetBytes),
		WiredLimit: bytesQuantity(hw.WiredLimitBytes), Accelerators: acceleratorStatus(hw.Accelerators),
	}
}

// acceleratorStatus is the status form of the node's cards, at most the API's 16.
func acceleratorStatus(acc []hardware.Accelerator) []v1alpha1.AcceleratorStatus {
	var out []v1alpha1.AcceleratorStatus
	for _, a := range acc[:min(len(acc), 16)] {
		out = append(out, v1alpha1.AcceleratorStatus{Name: truncate(a.Name, 128), Memory: bytesQuantity(a.MemoryBytes)})
	}
	return out
}

// memoryStatus is the status form of m. Used and committed are written even when zero
// (an idle pool uses nothing); the ceiling, watermarks and the agent's own footprint
// only when known.
func memoryStatus(m Memory) v1alpha1.NodeMemoryStatus {
	return v1alpha1.NodeMemoryStatus{
		Ceiling: bytesQuantity(m.CeilingBytes), SoftWatermark: bytesQuantity(m.SoftWatermarkBytes),
		HardWatermark: bytesQuantity(m.HardWatermarkBytes),
		Used:          resource.NewQuantity(max(m.UsedBytes, 0), resource.BinarySI),
		Agent:         bytesQuantity(m.AgentBytes),
		Committed:     resource.NewQuantity(max(m.CommittedBytes, 0), resource.BinarySI),
		Pressure:      pressureOrOK(m.Pressure), Evictions: m.Evictions, FreedBytesTotal: m.FreedBytesTotal,
	}
}

func pressureOrOK(p v1alpha1.PressureLevel) v1alpha1.PressureLevel {
	if p == "" {
		return v1alpha1.PressureOK
	}
	return p
}

// pressureCondition is the MemoryPressure condition for m: True from the soft
// watermark up. The message names the threshold crossed, not the usage, so that it
// changes with the level only.
func pressureCondition(m Memory) (metav1.ConditionStatus, string, string) {
	switch pressureOrOK(m.Pressure) {
	case v1alpha1.PressureSoft:
		return metav1.ConditionTrue, v1alpha1.ReasonPressureSoft, fmt.Sprintf(
			"Memory use is at or above the soft watermark of %s: new loads wait and idle models are evicted",
			formatBytes(m.SoftWatermarkBytes))
	case v1alpha1.PressureHard:
		return metav1.ConditionTrue, v1alpha1.ReasonPressureHard, fmt.Sprintf(
			"Memory use is at or above the hard watermark of %s: the least recently used model's work is aborted",
			formatBytes(m.HardWatermarkBytes))
	case v1alpha1.PressureEmergency:
		return metav1.ConditionTrue, v1alpha1.ReasonPressureEmergency, fmt.Sprintf(
			"Memory use exceeds the ceiling of %s: models are unloaded until it is back under", formatBytes(m.CeilingBytes))
	default:
		return metav1.ConditionFalse, v1alpha1.ReasonPressureOK, fmt.Sprintf(
			"Memory use is below the soft watermark of %s", formatBytes(m.SoftWatermarkBytes))
	}
}

// bytesQuantity is a binary-SI quantity of b bytes, nil when b is not positive.
func bytesQuantity(b int64) *resource.Quantity {
	if b <= 0 {
		return nil
	}
	return resource.NewQuantity(b, resource.BinarySI)
}

// formatBytes prints b in GiB or MiB with one decimal.
func formatBytes(b int64) string {
	if b >= gib {
		return fmt.Sprintf("%.1fGiB", float64(b)/float64(gib))
	}
	return fmt.Sprintf("%.1fMiB", float64(b)/float64(1<<20))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "")
}
