package main

import (
	"fmt"
	"strings"

	"github.com/macfleet/macfleet/agent/config"
)

// projectorFlagUsage is the help of serve's --projector.
const projectorFlagUsage = "a model's multimodal projector (mmproj GGUF), with which it answers images: [NAME=]PATH|SOURCE " +
	"(repeatable; NAME= may be left out when one model is served); a source (hf://, ollama://, https://) is pulled as a model's is"

// applyProjectors sets the projector of the models the --projector values name:
// NAME=PATH|SOURCE names the model, a bare PATH|SOURCE is the only model's.
func applyProjectors(models []config.Model, values []string) error {
	for _, v := range values {
		name, src := "", v
		if n, rest, ok := strings.Cut(v, "="); ok && !strings.Contains(n, "/") && !strings.Contains(n, ":") {
			name, src = n, rest
		}
		if src == "" {
			return fmt.Errorf("--projector %q: name the projector's file or source", v)
		}
		i, err := projectorModel(models, name)
		if err != nil {
			return fmt.Errorf("--projector %q: %w", v, err)
		}
		if models[i].Projector != "" {
			return fmt.Errorf("--projector %q: model %s has a projector already (%s)", v, models[i].Name, models[i].Projector)
		}
		models[i].Projector = src
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
