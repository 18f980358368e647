package layering

import (
	"fmt"
	"strings"
)

// Depguard renders the layer table as depguard rules for .golangci.yml (the entries
// under linters.settings.depguard.rules, indented by indent): one rule per layer that
// has layers above it, applying to the non-test files of the layer's packages and
// denying every package of a higher layer. module is the module path.
func Depguard(layers []Layer, module, indent string) string {
	var b strings.Builder
	for _, l := range layers {
		var deny []string
		for _, higher := range layers[l.Rank+1:] {
			for _, p := range higher.Patterns {
				for _, pkg := range denyPrefixes(module, p) {
					deny = append(deny, pkg, fmt.Sprintf("layer %d %s imports nothing of layer %d %s (docs/architecture.md)",
						l.Rank, l.Name, higher.Rank, higher.Name))
				}
			}
		}
		if len(deny) == 0 {
			continue
		}
		allow := allowedInside(layers, l, module)
		fmt.Fprintf(&b, "%slayer-%d-%s:\n", indent, l.Rank, l.Name)
		fmt.Fprintf(&b, "%s  list-mode: lax\n", indent)
		fmt.Fprintf(&b, "%s  files:\n", indent)
		for _, f := range fileGlobs(layers, l) {
			fmt.Fprintf(&b, "%s    - %q\n", indent, f)
		}
		fmt.Fprintf(&b, "%s    - \"!$test\"\n", indent)
		if len(allow) > 0 {
			// A package of this layer or below nested in a denied one (gateway/tenancy
			// in gateway/...): lax mode lets the longer allow prefix win.
			fmt.Fprintf(&b, "%s  allow:\n", indent)
			for _, a := range allow {
				fmt.Fprintf(&b, "%s    - %q\n", indent, a)
			}
		}
		fmt.Fprintf(&b, "%s  deny:\n", indent)
		for i := 0; i < len(deny); i += 2 {
			fmt.Fprintf(&b, "%s    - pkg: %q\n%s      desc: %q\n", indent, deny[i], indent, deny[i+1])
		}
	}
	return b.String()
}

// allowedInside returns the package prefixes of the patterns of layer l and the
// layers below it that are nested in a pattern of a higher layer: depguard denies by
// prefix, so without them gateway/... would deny gateway/tenancy/..., which stands
// lower.
func allowedInside(layers []Layer, l Layer, module string) []string {
	var allow []string
	for _, higher := range layers[l.Rank+1:] {
		for _, p := range higher.Patterns {
			for _, lower := range layers[:l.Rank+1] {
				for _, q := range lower.Patterns {
					if nested(q, p) {
						allow = append(allow, denyPrefixes(module, q)...)
					}
				}
			}
		}
	}
	return allow
}

// denyPrefixes returns the depguard package prefixes of a pattern: "x$" for one
// package (depguard's exact match), "x$" and "x/" for a package and those below it.
func denyPrefixes(module, pattern string) []string {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return []string{module + "/" + base + "$", module + "/" + base + "/"}
	}
	return []string{module + "/" + pattern + "$"}
}

// fileGlobs returns the file globs of layer l, relative to ${base-path} (the
// directory of .golangci.yml): its patterns, less the more specific patterns of other
// layers nested in them.
func fileGlobs(layers []Layer, l Layer) []string {
	var globs []string
	for _, p := range l.Patterns {
		globs = append(globs, fileGlob(p))
		for _, other := range layers {
			if other.Rank == l.Rank {
				continue
			}
			for _, q := range other.Patterns {
				if nested(q, p) {
					globs = append(globs, "!"+fileGlob(q))
				}
			}
		}
	}
	return globs
}

// nested reports whether pattern q is a more specific pattern inside pattern p.
func nested(q, p string) bool {
	base, ok := strings.CutSuffix(p, "/...")
	if !ok {
		return false
	}
	qbase := strings.TrimSuffix(q, "/...")
	return strings.HasPrefix(qbase, base+"/")
}

func fileGlob(pattern string) string {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return "${base-path}/" + base + "/**"
	}
	return "${base-path}/" + pattern + "/*.go"
}
