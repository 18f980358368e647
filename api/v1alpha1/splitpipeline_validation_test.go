package v1alpha1_test

import (
	"strconv"
	"testing"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/test/support/testenv"
)

// TestSplitPipelineValidation applies engine.splitPipeline values, with and without
// parallel, to the real API server, as JSON so that an explicit 0 reaches it. An unset
// parallel is defaulted to 1 before the rules run.
func TestSplitPipelineValidation(t *testing.T) {
	ns := testenv.NewNamespace(t, env.Client)
	const bounds = "splitPipeline must be between 1 (one context) and 8"
	const multiple = "parallel must be a multiple of splitPipeline"
	cases := []struct {
		name     string
		pipeline int64
		parallel int64 // 0: unset
		wantErr  string
	}{
		{name: "one", pipeline: 1},
		{name: "two contexts of two slots", pipeline: 2, parallel: 4},
		{name: "eight contexts of one slot", pipeline: 8, parallel: 8},
		{name: "zero", pipeline: 0, parallel: 4, wantErr: bounds},
		{name: "negative", pipeline: -1, parallel: 4, wantErr: bounds},
		{name: "nine", pipeline: 9, parallel: 9, wantErr: bounds},
		{name: "slots not a multiple", pipeline: 2, parallel: 3, wantErr: multiple},
		{name: "more contexts than slots", pipeline: 4, parallel: 2, wantErr: multiple},
		{name: "default parallel of 1", pipeline: 2, wantErr: multiple},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eng := map[string]any{"splitPipeline": tc.pipeline}
			if tc.parallel != 0 {
				eng["parallel"] = tc.parallel
			}
			err := createUnstructured(t, map[string]any{
				"apiVersion": mfv1.GroupVersion.String(), "kind": "ModelDeployment",
				"metadata": map[string]any{"namespace": ns, "name": "pipeline-" + strconv.Itoa(i)},
				"spec": map[string]any{
					"model":     map[string]any{"source": validDeployment().Model.Source},
					"engine":    eng,
					"placement": map[string]any{"maxMacsPerReplica": int64(2)},
				},
			})
			checkErr(t, err, tc.wantErr)
		})
	}
}
