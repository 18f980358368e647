package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/internal/estimate"
	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// TestHeaderEstimatesAsTheModel: a header-only model is estimated exactly as the
// whole synthesized model of the same shape, so the table's figures are the ones the
// manager would compute for the real files' shapes.
func TestHeaderEstimatesAsTheModel(t *testing.T) {
	dir := t.TempDir()
	for _, dt := range []ggufsynth.DType{ggufsynth.F16, ggufsynth.Q8_0, ggufsynth.Q4_0} {
		spec := ggufsynth.Small()
		spec.DType, spec.Untied = dt, true
		whole, header := filepath.Join(dir, "whole-"+string(dt)+".gguf"), filepath.Join(dir, "header-"+string(dt)+".gguf")
		if err := ggufsynth.Write(whole, spec); err != nil {
			t.Fatal(err)
		}
		if err := ggufsynth.WriteHeader(header, spec); err != nil {
			t.Fatal(err)
		}
		wi, _ := os.Stat(whole)
		hi, _ := os.Stat(header)
		if wi.Size() != hi.Size() {
			t.Errorf("%s: the header-only file is %d bytes, the model %d", dt, hi.Size(), wi.Size())
		}
		var ests [2]estimate.Result
		for i, path := range []string{whole, header} {
			var err error
			if ests[i], err = estimate.Estimate(t.Context(), estimate.Params{Path: path, ContextLength: 2048}); err != nil {
				t.Fatal(err)
			}
		}
		if diff := cmp.Diff(ests[0], ests[1]); diff != "" || ests[0].Weights == 0 {
			t.Errorf("%s: the header's estimate differs from the model's (-model +header):\n%s", dt, diff)
		}
	}
}

// TestTable estimates a small shape into the table: one row per storage type and
// context, a verdict per Mac that agrees with the estimate and the ceiling.
func TestTable(t *testing.T) {
	models := []Model{{"small", ggufsynth.Small()}}
	rows, err := Estimate(t.Context(), t.TempDir(), models, []ggufsynth.DType{ggufsynth.F16}, []int32{1024, 4096})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[1].Est.KVCache <= rows[0].Est.KVCache {
		t.Fatalf("rows %+v: want two, the longer context with the larger KV cache", rows)
	}
	var out bytes.Buffer
	Write(&out, rows)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("table:\n%s", out.String())
	}
	for _, line := range lines[2:] {
		if strings.Count(line, "| yes, ") != len(MacsGiB) {
			t.Errorf("a small model does not fit every Mac: %s", line)
		}
	}
	if c16, c32 := Ceiling(16), Ceiling(32); c16 <= 0 || c16 >= 12<<30 || c32 <= c16 {
		t.Errorf("ceilings 16 GB %d, 32 GB %d: want Metal's working set below the static 12 GiB on 16 GB, more on 32 GB", c16, c32)
	}
}
