package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/agent/config"
)

func TestApplyProjectors(t *testing.T) {
	two := func() []config.Model {
		return []config.Model{{Name: "a", Path: "/m/a.gguf"}, {Name: "b", Path: "/m/b.gguf"}}
	}
	for _, tc := range []struct {
		name   string
		models []config.Model
		values []string
		want   []string // each model's projector
		err    string
	}{
		{name: "the only model's", models: []config.Model{{Name: "a"}}, values: []string{"hf://org/m-GGUF/mmproj-f16.gguf"},
			want: []string{"hf://org/m-GGUF/mmproj-f16.gguf"}},
		{name: "by name", models: two(), values: []string{"b=/m/mmproj.gguf"}, want: []string{"", "/m/mmproj.gguf"}},
		{name: "a URL with = in its query is not a name", models: []config.Model{{Name: "a"}}, values: []string{"https://x.example/p.gguf?v=1"},
			want: []string{"https://x.example/p.gguf?v=1"}},
		{name: "no name, two models", models: two(), values: []string{"/m/mmproj.gguf"}, err: "2 models are served: write NAME=PATH"},
		{name: "an unknown name", models: two(), values: []string{"c=/m/mmproj.gguf"}, err: `no model is named "c"`},
		{name: "twice", models: two(), values: []string{"a=/m/p1.gguf", "a=/m/p2.gguf"}, err: "has a projector already"},
		{name: "empty", models: two(), values: []string{"a="}, err: "name the projector's file or source"},
	} {
		err := applyProjectors(tc.models, tc.values)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var got []string
		for _, m := range tc.models {
			got = append(got, m.Projector)
		}
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, d)
		}
	}
}
