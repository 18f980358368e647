package main

import (
	"fmt"
	"strings"

	"github.com/macfleet/macfleet/agent/config"
)

// projectorFlagUsage is the help of serve's --projector.
const projectorFlagUsage = "a model's multimodal projector (mmproj GGUF), with which it answers images: [NAME=]PATH|SOURCE " +
	"(repeatable; NAME= may be left out when one model is served); a source (hf://, ollama://, https://) is pulled as a model's is"

// draftFlagUsage is the help of serve's --draft.
const draftFlagUsage = "a model's draft model for speculative decoding (a smaller GGUF of the same vocabulary): [NAME=]PATH|SOURCE " +
	"(repeatable; NAME= may be left out when one model is served); a source (hf://, ollama://, https://) is pulled as a model's is"

// modelFile is a file that serve's flags give a model beside its GGUF: its flag, what
// it is, and its field of config.Model.
type modelFile struct {
	flag, noun string
	field      func(*config.Model) *string
}

// The files beside a model: its projector (--projector) and its draft (--draft).
var (
	projectorFile = modelFile{"--projector", "projector", func(m *config.Model) *string { return &m.Projector }}
	draftFile     = modelFile{"--draft", "draft model", func(m *config.Model) *string { return &m.Draft }}
	modelFiles    = []modelFile{projectorFile, draftFile}
)

// applyProjectors sets the projector of the models the --projector values name:
// NAME=PATH|SOURCE names the model, a bare PATH|SOURCE is the only model's.
func applyProjectors(models []config.Model, values []string) error {
	return applyFiles(models, values, projectorFile)
}

// applyFiles sets file f of the models its flag's values name, as applyProjectors
// does the projector.
func applyFiles(models []config.Model, values []string, f modelFile) error {
	for _, v := range values {
		name, src := "", v
		if n, rest, ok := strings.Cut(v, "="); ok && !strings.Contains(n, "/") && !strings.Contains(n, ":") {
			name, src = n, rest
		}
		if src == "" {
			return fmt.Errorf("%s %q: name the %s's file or source", f.flag, v, f.noun)
		}
		i, err := projectorModel(models, name)
		if err != nil {
			return fmt.Errorf("%s %q: %w", f.flag, v, err)
		}
		if cur := f.field(&models[i]); *cur != "" {
			return fmt.Errorf("%s %q: model %s has a %s already (%s)", f.flag, v, models[i].Name, f.noun, *cur)
		}
		*f.field(&models[i]) = src
	}
	return nil
}

// projectorModel is the index of the model named name, or of the only model when
// name is empty.
func projectorModel(models []config.Model, name string) (int, error) {
	if name == "" {
		if len(models) != 1 {
			return 0, fmt.Errorf("%d models are served: write NAME=PATH to say whose projector it is", len(models))
		}
		return 0, nil
	}
	for i, m := range models {
		if m.Name == name {
			return i, nil
		}
	}
	return 0, fmt.Errorf("no model is named %q", name)
}
