// Package layering holds the rule that keeps the packages of this module in floors: a
// package may import packages of its own layer and of the layers below it, never of a
// layer above. The layers are the table in docs/architecture.md (between the
// "layers:begin" and "layers:end" comments); this package reads that table, assigns
// each package to the layer of its most specific pattern, and lists the imports that
// run upward. TestNoUpwardImports runs it over `go list` of the module;
// TestDepguardMirrorsLayers keeps the depguard rules of .golangci.yml equal to the
// table, so the linter reports an upward import where it is written.
package layering

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Layer is one row of the table: its rank (0 is the ground floor), its name and the
// package patterns it holds. A pattern is a path relative to the module, either one
// package ("gateway") or a package and everything below it ("agent/...").
type Layer struct {
	Rank     int
	Name     string
	Patterns []string
}

// Package is a package of the module and the module packages it imports, both as
// paths relative to the module.
type Package struct {
	Path    string
	Imports []string
}

// Violation is an import from a lower layer to a higher one.
type Violation struct {
	From, To           string
	FromLayer, ToLayer Layer
}

func (v Violation) String() string {
	return fmt.Sprintf("%s (layer %d %s) imports %s (layer %d %s)",
		v.From, v.FromLayer.Rank, v.FromLayer.Name, v.To, v.ToLayer.Rank, v.ToLayer.Name)
}

const (
	beginMarker = "<!-- layers:begin"
	endMarker   = "<!-- layers:end"
)

// ParseTable reads the layer table of a Markdown document: the rows between the
// begin and end markers whose first cell is a number. The second cell is the layer's
// name, the third its patterns in backquotes.
func ParseTable(doc []byte) ([]Layer, error) {
	var layers []Layer
	in, seen := false, map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, beginMarker):
			in = true
			continue
		case strings.HasPrefix(line, endMarker):
			in = false
			continue
		}
		if !in || !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 3 {
			continue
		}
		rank, err := strconv.Atoi(strings.TrimSpace(cells[0]))
		if err != nil {
			continue // the header and the separator row
		}
		l := Layer{Rank: rank, Name: strings.TrimSpace(cells[1]), Patterns: backquoted(cells[2])}
		if len(l.Patterns) == 0 {
			return nil, fmt.Errorf("layer %d %s lists no package", rank, l.Name)
		}
		for _, p := range l.Patterns {
			if other, dup := seen[p]; dup {
				return nil, fmt.Errorf("pattern %s is in layers %s and %s", p, other, l.Name)
			}
			seen[p] = l.Name
		}
		layers = append(layers, l)
	}
	if len(layers) == 0 {
		return nil, fmt.Errorf("no layer table between %q and %q", beginMarker, endMarker)
	}
	for i, l := range layers {
		if l.Rank != i {
			return nil, fmt.Errorf("layer %s has rank %d, want %d (ranks count up from 0 in table order)", l.Name, l.Rank, i)
		}
	}
	return layers, nil
}

// backquoted returns the strings in backquotes in s.
func backquoted(s string) []string {
	var out []string
	parts := strings.Split(s, "`")
	for i := 1; i < len(parts); i += 2 {
		if p := strings.TrimSpace(parts[i]); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// matches reports whether pattern covers path, and how specific the match is (the
// length of the pattern's path; longer wins).
func matches(pattern, path string) (bool, int) {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/"), len(base)
	}
	return path == pattern, len(pattern)
}

// LayerOf returns the layer of the most specific pattern that covers path.
func LayerOf(layers []Layer, path string) (Layer, bool) {
	best, bestLen, found := Layer{}, -1, false
	for _, l := range layers {
		for _, p := range l.Patterns {
			if ok, n := matches(p, path); ok && n > bestLen {
				best, bestLen, found = l, n, true
			}
		}
	}
	return best, found
}

// Check returns the imports that run from a lower layer to a higher one and the
// packages no pattern covers (a new package must be given a layer), both sorted.
// Imports of packages outside pkgs are ignored.
func Check(layers []Layer, pkgs []Package) (violations []Violation, unassigned []string) {
	for _, p := range pkgs {
		from, ok := LayerOf(layers, p.Path)
		if !ok {
			unassigned = append(unassigned, p.Path)
			continue
		}
		for _, imp := range p.Imports {
			to, ok := LayerOf(layers, imp)
			if ok && to.Rank > from.Rank {
				violations = append(violations, Violation{From: p.Path, To: imp, FromLayer: from, ToLayer: to})
			}
		}
	}
	slices.SortFunc(violations, func(a, b Violation) int {
		return strings.Compare(a.From+" "+a.To, b.From+" "+b.To)
	})
	slices.Sort(unassigned)
	return violations, unassigned
}

// Reaching returns what lifts the packages under dir (a path relative to the module,
// "internal") above layer top: each such package the table places higher, and each
// import of one of them into a higher layer, sorted and each once. It keeps a folder
// to the floors it is meant for whatever the table says of its packages: moving a
// package of internal/ up a layer to let it import a component is caught here.
func Reaching(layers []Layer, pkgs []Package, dir string, top int) []string {
	var out []string
	for _, p := range pkgs {
		if p.Path != dir && !strings.HasPrefix(p.Path, dir+"/") {
			continue
		}
		if l, ok := LayerOf(layers, p.Path); ok && l.Rank > top {
			out = append(out, fmt.Sprintf("%s is in layer %d %s", p.Path, l.Rank, l.Name))
		}
		for _, imp := range p.Imports {
			if l, ok := LayerOf(layers, imp); ok && l.Rank > top {
				out = append(out, fmt.Sprintf("%s imports %s (layer %d %s)", p.Path, imp, l.Rank, l.Name))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
