package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/macfleet/macfleet/test/layering"
)

// internalUpwardImports counts the imports from a package under internal/ (the
// library folder) of a module package above its own layer or above the ceiling layer
// (cfg.internalCeiling: the highest layer a library may reach; a composition root or
// a command in internal/ imports components above it). A package importing another
// from several files counts once, at its first import.
func internalUpwardImports(m *module, cfg config) (result, error) {
	r := result{name: "internal-upward-imports"}
	doc, err := os.ReadFile(filepath.Join(m.root, filepath.FromSlash(cfg.layerDoc)))
	if err != nil {
		return r, err
	}
	layers, err := layering.ParseTable(doc)
	if err != nil {
		return r, fmt.Errorf("%s: %w", cfg.layerDoc, err)
	}
	i := slices.IndexFunc(layers, func(l layering.Layer) bool { return l.Name == cfg.internalCeiling })
	if i < 0 {
		return r, fmt.Errorf("%s has no layer %q (internal-ceiling)", cfg.layerDoc, cfg.internalCeiling)
	}
	ceiling := layers[i].Rank
	seen := map[string]bool{}
	for _, f := range m.files {
		if !under(f.dir, "internal") {
			continue
		}
		from, ok := layering.LayerOf(layers, f.dir)
		if !ok {
			continue // test/layering reports a package in no layer
		}
		for _, spec := range f.ast.Imports {
			p, _ := strconv.Unquote(spec.Path.Value)
			rel, ok := strings.CutPrefix(p, m.path+"/")
			if !ok {
				continue
			}
			to, ok := layering.LayerOf(layers, rel)
			if !ok || (to.Rank <= from.Rank && to.Rank <= ceiling) || seen[f.dir+" "+rel] {
				continue
			}
			seen[f.dir+" "+rel] = true
			r.count++
			r.offenders = append(r.offenders, fmt.Sprintf("%s %s (layer %d %s) imports %s (layer %d %s)",
				m.at(spec.Pos()), f.dir, from.Rank, from.Name, rel, to.Rank, to.Name))
		}
	}
	return r, nil
}
