package credentials_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestNodeCannotWriteItsEffectiveCeiling: status.effectiveCeiling is what the
// control plane believes of a Mac's memory, shown in kubectl's Ceiling column; the
// Mac may not write it, not even to the value it holds, while its agent's own status
// writes, which leave it alone, pass.
func TestNodeCannotWriteItsEffectiveCeiling(t *testing.T) {
	install(t)
	forget(t, "mac-eff")
	c, _ := issue(t, "mac-eff")
	waitForPolicy(t, c)
	ctx := t.Context()
	if err := c.Create(ctx, macNode("mac-eff")); err != nil {
		t.Fatal(err)
	}
	// The manager writes what it believes. The claims policy takes every MacNode as
	// a parameter, and the API server refuses writes it governs until its informer of
	// MacNodes has synced ("not yet synced"): only that refusal is retried.
	testenv.Eventually(t, 30*time.Second, 50*time.Millisecond, func() (bool, string) {
		err := patchMacNodeStatus(ctx, env.Client, "mac-eff", func(n *v1alpha1.MacNode) {
			n.Status.EffectiveCeiling = &v1alpha1.EffectiveCeiling{Bytes: resource.MustParse("32Gi"), Display: "32.0 GiB", Source: "Chip"}
		})
		if err != nil && !strings.Contains(err.Error(), "not yet synced") {
			t.Fatalf("the manager writing the effective ceiling: %v", err)
		}
		return err == nil, fmt.Sprintf("the manager writing the effective ceiling: %v", err)
	})
	const want = "node mac-eff may not write status.effectiveCeiling of its MacNode"
	for name, eff := range map[string]*v1alpha1.EffectiveCeiling{
		"raise it":  {Bytes: resource.MustParse("1Ti"), Display: "1.0 TiB", Source: "Reported"},
		"remove it": nil,
		// The memory first measured bounds every later claim (internal/ceiling.Measured).
		"raise its measured memory": {Bytes: resource.MustParse("32Gi"), Display: "32.0 GiB", Source: "Chip",
			MeasuredMemory: new(resource.MustParse("1Ti"))},
	} {
		err := patchMacNodeStatus(ctx, c, "mac-eff", func(n *v1alpha1.MacNode) { n.Status.EffectiveCeiling = eff })
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("the Mac writing its effective ceiling (%s): got %s, want 403 with %q", name, errString(err), want)
		}
	}
	err := patchMacNodeStatus(ctx, c, "mac-eff", func(n *v1alpha1.MacNode) {
		n.Status.Memory.Ceiling = new(resource.MustParse("1Ti"))
		n.Status.Display = &v1alpha1.MemoryDisplay{Ceiling: "1.0 TiB"}
	})
	if err != nil {
		t.Errorf("the Mac reporting its ceiling: %v", err)
	}
	var n v1alpha1.MacNode
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "mac-eff"}, &n); err != nil {
		t.Fatal(err)
	}
	if e := n.Status.EffectiveCeiling; e == nil || e.Display != "32.0 GiB" {
		t.Errorf("status.effectiveCeiling = %+v, want the manager's 32.0 GiB", e)
	}
}
