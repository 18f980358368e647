package macnode

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestAttackClaimedChipRaisesTheCeiling: with no operator bound, the control plane
// believed a Mac's reported ceiling up to the largest memory of the chip the Mac
// itself claims. A Mac that first reports honestly (an M4 with 16 GiB, a 12 GiB
// ceiling) then claims an M4 Max with 128 GiB and a 120 GiB ceiling, and another
// that claims an M4 Max from the start while its agent measured 16 GiB, each went
// from 12 GiB (or nothing) to 100 GiB and more of replicas. Now the ceiling the
// scheduler places by (status.effectiveCeiling, ceiling.Node) stays within the
// memory first measured, which the controller keeps in status.effectiveCeiling where
// a node may not write, and CeilingCapped says why.
func TestAttackClaimedChipRaisesTheCeiling(t *testing.T) {
	f := newFixture(t)
	report := func(name, chip, memory, ceiling string) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var n v1alpha1.MacNode
			if err := f.c.Get(t.Context(), types.NamespacedName{Name: name}, &n); err != nil {
				return err
			}
			n.Status.Hardware.Chip = chip
			n.Status.Hardware.UnifiedMemory = ptr.To(resource.MustParse(memory))
			n.Status.Memory.Ceiling = ptr.To(resource.MustParse(ceiling))
			return f.c.Status().Update(t.Context(), &n)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	believed := func(name, display, source, reason string) {
		t.Helper()
		testenv.Eventually(t, wait, poll, func() (bool, string) {
			var n v1alpha1.MacNode
			if err := f.c.Get(t.Context(), types.NamespacedName{Name: name}, &n); err != nil {
				return false, err.Error()
			}
			e := n.Status.EffectiveCeiling
			cond := meta.FindStatusCondition(n.Status.Conditions, v1alpha1.MacNodeCeilingCapped)
			got := ""
			if cond != nil {
				got = cond.Reason
			}
			return e != nil && e.Display == display && e.Source == source && got == reason,
				fmt.Sprintf("status.effectiveCeiling %+v, CeilingCapped %q; want %s from %s, CeilingCapped %q", e, got, display, source, reason)
		})
	}

	liar := f.node("chip-later", false, leaseSeconds*time.Second)
	report(liar, "Apple M4", "16Gi", "12Gi")
	believed(liar, "12.0 GiB", "Reported", "")
	report(liar, "Apple M4 Max", "128Gi", "120Gi")
	believed(liar, "16.0 GiB", "Measured", v1alpha1.ReasonMeasuredMemoryExceeded)

	claimer := f.node("chip-first", false, leaseSeconds*time.Second)
	report(claimer, "Apple M4 Max", "16Gi", "100Gi")
	believed(claimer, "16.0 GiB", "Measured", v1alpha1.ReasonMeasuredMemoryExceeded)
}
