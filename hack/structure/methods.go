package main

import (
	"cmp"
	"fmt"
	"go/ast"
	"go/token"
	"slices"
)

// namedType is a type of the module: its package's folder and name, and its own name.
type namedType struct {
	dir, pkg, name string
}

// widestMethodSet counts the methods of each named type declared in the folders (and
// below), value and pointer receivers together, and reports the largest count. Its
// offenders are the types with that count, in file order (file:line of the
// declaration, the type and its count); a method whose type is declared in no counted file (a test file's
// type) is left out.
func widestMethodSet(m *module, folders []string) result {
	r := result{name: "widest-method-set"}
	decl := map[namedType]token.Pos{}
	methods := map[namedType]int{}
	for _, f := range m.files {
		if !slices.ContainsFunc(folders, func(folder string) bool { return under(f.dir, folder) }) {
			continue
		}
		for _, ts := range typeSpecs(f.ast) {
			decl[namedType{f.dir, f.ast.Name.Name, ts.Name.Name}] = ts.Pos()
		}
		for _, d := range f.ast.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && recvName(fd) != "" {
				methods[namedType{f.dir, f.ast.Name.Name, recvName(fd)}]++
			}
		}
	}
	var widest []namedType
	for t, n := range methods {
		if _, ok := decl[t]; !ok {
			continue
		}
		switch {
		case n > r.count:
			r.count, widest = n, []namedType{t}
		case n == r.count:
			widest = append(widest, t)
		}
	}
	slices.SortFunc(widest, func(a, b namedType) int { return cmp.Compare(decl[a], decl[b]) })
	for _, t := range widest {
		r.offenders = append(r.offenders, fmt.Sprintf("%s %s (%d methods)", m.at(decl[t]), t.name, r.count))
	}
	return r
}
