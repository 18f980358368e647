package main

import (
	"strings"
	"testing"

	"github.com/macfleet/macfleet/agent/config"
)

// TestApplyDrafts: serve's --draft gives a model its draft model as --projector gives
// its projector, independently of it.
func TestApplyDrafts(t *testing.T) {
	models := []config.Model{{Name: "a", Projector: "/m/mmproj.gguf"}, {Name: "b"}}
	if err := applyFiles(models, []string{"a=hf://org/small-GGUF/small.gguf", "b=/m/small.gguf"}, draftFile); err != nil {
		t.Fatal(err)
	}
	if models[0].Draft != "hf://org/small-GGUF/small.gguf" || models[1].Draft != "/m/small.gguf" || models[0].Projector != "/m/mmproj.gguf" {
		t.Errorf("models %+v", models)
	}
	for _, tc := range []struct{ values []string }{{[]string{"a=/m/other.gguf"}}, {[]string{"/m/x.gguf"}}, {[]string{"b="}}} {
		err := applyFiles(models, tc.values, draftFile)
		if err == nil || !strings.HasPrefix(err.Error(), "--draft ") {
			t.Errorf("%v: %v, want an error of --draft", tc.values, err)
		}
	}
	if err := applyFiles(models, []string{"a=/m/other.gguf"}, draftFile); err == nil || !strings.Contains(err.Error(), "model a has a draft model already") {
		t.Errorf("a second draft: %v", err)
	}
}
