package macnode

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// columns is MacNode name as the API server prints it for kubectl get: column name
// to cell.
func columns(t *testing.T, name string) map[string]string {
	t.Helper()
	hc, err := rest.HTTPClientFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet,
		strings.TrimSuffix(env.Config.Host, "/")+"/apis/macfleet.dev/v1alpha1/macnodes/"+name, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var table metav1.Table
	if err := json.NewDecoder(resp.Body).Decode(&table); err != nil || len(table.Rows) != 1 {
		t.Fatalf("the table of MacNode %s: %d rows, %v", name, len(table.Rows), err)
	}
	out := map[string]string{}
	for i, c := range table.ColumnDefinitions {
		out[c.Name] = fmt.Sprint(table.Rows[0].Cells[i])
	}
	return out
}

// TestKubectlShowsTheEffectiveCeiling: a Mac that reports more memory than its chip
// has is shown in kubectl's Ceiling column with what the scheduler believes (the
// chip's memory, then the operator's bound once set), its report in the Reported
// column.
func TestKubectlShowsTheEffectiveCeiling(t *testing.T) {
	f := newFixture(t)
	name := f.node("ceiling", false, leaseSeconds*time.Second)
	// The agent reports its ceiling and its display.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var n v1alpha1.MacNode
		if err := f.c.Get(t.Context(), types.NamespacedName{Name: name}, &n); err != nil {
			return err
		}
		n.Status.Hardware.Chip = "Apple M4"
		n.Status.Memory.Ceiling = ptr.To(resource.MustParse("1Ti"))
		n.Status.Display = &v1alpha1.MemoryDisplay{Ceiling: "1.0 TiB"}
		return f.c.Status().Update(t.Context(), &n)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := func(ceiling, source string) {
		t.Helper()
		testenv.Eventually(t, wait, poll, func() (bool, string) {
			var n v1alpha1.MacNode
			if err := f.c.Get(t.Context(), types.NamespacedName{Name: name}, &n); err != nil {
				return false, err.Error()
			}
			if e := n.Status.EffectiveCeiling; e == nil || e.Display != ceiling || e.Source != source {
				return false, fmt.Sprintf("status.effectiveCeiling = %+v, want %s from %s", e, ceiling, source)
			}
			cols := columns(t, name)
			return cols["Ceiling"] == ceiling && cols["Reported"] == "1.0 TiB",
				fmt.Sprintf("kubectl columns %v, want Ceiling %s and Reported 1.0 TiB", cols, ceiling)
		})
	}
	want("32.0 GiB", "Chip")

	n := &v1alpha1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := f.c.Patch(t.Context(), n, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"memoryCeiling":"2Gi"}}`))); err != nil {
		t.Fatal(err)
	}
	want("2.0 GiB", "Operator")
}
