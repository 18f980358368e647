package main

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// module is the parsed non-test, non-generated Go files of a module, every build
// constraint included, in path order.
type module struct {
	root  string // the directory of go.mod
	path  string // the module path
	fset  *token.FileSet
	files []*srcFile
}

// srcFile is one parsed file.
type srcFile struct {
	rel string // slash path from the module root
	dir string // its folder, slash path ("." for the root)
	ast *ast.File
}

// scanModule parses the Go files of the module at root, leaving out test files,
// generated files (zz_generated*, or a "Code generated" header), testdata, vendor,
// bin, hidden folders and nested modules.
func scanModule(root string) (*module, error) {
	root, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	modPath, err := modulePath(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, err
	}
	m := &module{root: root, path: modPath, fset: token.NewFileSet()}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && skipDir(p, rel, d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") ||
			strings.HasPrefix(name, "zz_generated") {
			return nil
		}
		f, err := parser.ParseFile(m.fset, p, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if !ast.IsGenerated(f) {
			m.files = append(m.files, &srcFile{rel: rel, dir: path.Dir(rel), ast: f})
		}
		return nil
	})
	return m, err
}

// skipDir reports whether the folder at p (rel from the root) holds no files of the
// module.
func skipDir(p, rel, name string) bool {
	switch {
	case name == "testdata" || name == "vendor" || rel == "bin",
		strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_"):
		return true
	}
	_, err := os.Stat(filepath.Join(p, "go.mod"))
	return err == nil
}

// modulePath reads the module line of a go.mod.
func modulePath(gomod string) (string, error) {
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	return "", fmt.Errorf("%s has no module line", gomod)
}

// under reports whether the folder dir is folder or below it.
func under(dir, folder string) bool {
	return dir == folder || strings.HasPrefix(dir, folder+"/")
}

// at is a position as file:line, the file relative to the module root.
func (m *module) at(pos token.Pos) string {
	p := m.fset.Position(pos)
	rel, err := filepath.Rel(m.root, p.Filename)
	if err != nil {
		rel = p.Filename
	}
	return fmt.Sprintf("%s:%d", filepath.ToSlash(rel), p.Line)
}

// recvName is the name of a method's receiver type, "" for a function.
func recvName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// funcName is Recv.Name for a method, Name for a function.
func funcName(fd *ast.FuncDecl) string {
	if r := recvName(fd); r != "" {
		return r + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// pointerOnlyMethods counts the methods of the types whose struct has one field, a
// pointer to another named type of the module (`type loader struct{ p *Pool }`).
func pointerOnlyMethods(m *module) result {
	type pkg struct{ dir, name string }
	declared := map[pkg]map[string]bool{}
	for _, f := range m.files {
		k := pkg{f.dir, f.ast.Name.Name}
		if declared[k] == nil {
			declared[k] = map[string]bool{}
		}
		for _, ts := range typeSpecs(f.ast) {
			declared[k][ts.Name.Name] = true
		}
	}
	holders := map[pkg]map[string]bool{}
	for _, f := range m.files {
		k := pkg{f.dir, f.ast.Name.Name}
		for _, ts := range typeSpecs(f.ast) {
			if m.pointsToOther(f.ast, ts, declared[k]) {
				if holders[k] == nil {
					holders[k] = map[string]bool{}
				}
				holders[k][ts.Name.Name] = true
			}
		}
	}
	r := result{name: "pointer-only-methods"}
	for _, f := range m.files {
		for _, d := range f.ast.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if ok && holders[pkg{f.dir, f.ast.Name.Name}][recvName(fd)] {
				r.count++
				r.offenders = append(r.offenders, m.at(fd.Pos())+" "+funcName(fd))
			}
		}
	}
	return r
}

// typeSpecs are the top-level type declarations of f.
func typeSpecs(f *ast.File) []*ast.TypeSpec {
	var out []*ast.TypeSpec
	for _, d := range f.Decls {
		if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.TYPE {
			for _, s := range gd.Specs {
				out = append(out, s.(*ast.TypeSpec))
			}
		}
	}
	return out
}

// pointsToOther reports whether ts is a struct of one field whose type is a pointer to
// another named type of the module: one of declared (the types of its package) other
// than itself, or a type of a module package f imports.
func (m *module) pointsToOther(f *ast.File, ts *ast.TypeSpec, declared map[string]bool) bool {
	st, ok := ts.Type.(*ast.StructType)
	if !ok || ts.Assign.IsValid() || len(st.Fields.List) != 1 || len(st.Fields.List[0].Names) > 1 {
		return false
	}
	star, ok := st.Fields.List[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	t := star.X
	switch x := t.(type) {
	case *ast.IndexExpr:
		t = x.X
	case *ast.IndexListExpr:
		t = x.X
	}
	switch x := t.(type) {
	case *ast.Ident:
		return declared[x.Name] && x.Name != ts.Name.Name && !isTypeParam(ts, x.Name)
	case *ast.SelectorExpr:
		id, ok := x.X.(*ast.Ident)
		return ok && m.importsModulePackage(f, id.Name)
	}
	return false
}

// isTypeParam reports whether name is a type parameter of ts.
func isTypeParam(ts *ast.TypeSpec, name string) bool {
	if ts.TypeParams == nil {
		return false
	}
	for _, field := range ts.TypeParams.List {
		for _, n := range field.Names {
			if n.Name == name {
				return true
			}
		}
	}
	return false
}

// importsModulePackage reports whether f imports a package of the module as name.
func (m *module) importsModulePackage(f *ast.File, name string) bool {
	for _, spec := range f.Imports {
		p, err := strconv.Unquote(spec.Path.Value)
		if err != nil || !under(p, m.path) {
			continue
		}
		local := path.Base(p)
		if spec.Name != nil {
			local = spec.Name.Name
		}
		if local == name {
			return true
		}
	}
	return false
}

// wideParams counts the functions and methods in folder (and below) with more than
// maxParams parameters, each named parameter counted, the receiver not.
func wideParams(m *module, folder string, maxParams int) result {
	r := result{name: folder + "-wide-params"}
	for _, f := range m.files {
		if !under(f.dir, folder) {
			continue
		}
		for _, d := range f.ast.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			n := 0
			for _, field := range fd.Type.Params.List {
				n += max(1, len(field.Names))
			}
			if n > maxParams {
				r.count++
				r.offenders = append(r.offenders, fmt.Sprintf("%s %s (%d parameters)", m.at(fd.Pos()), funcName(fd), n))
			}
		}
	}
	return r
}

// longFunctions counts the functions whose body runs over maxLines lines (the lines
// between its braces, as golangci-lint's funlen counts them), outside hack/. A function
// literal inside a function is part of it; one in a top-level var is measured alone.
func longFunctions(m *module, maxLines int) result {
	r := result{name: "long-functions"}
	long := func(name string, pos token.Pos, body *ast.BlockStmt) {
		n := m.fset.Position(body.Rbrace).Line - m.fset.Position(body.Lbrace).Line - 1
		if n > maxLines {
			r.count++
			r.offenders = append(r.offenders, fmt.Sprintf("%s %s (%d lines)", m.at(pos), name, n))
		}
	}
	for _, f := range m.files {
		if under(f.dir, "hack") {
			continue
		}
		for _, d := range f.ast.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Body != nil {
					long(funcName(d), d.Pos(), d.Body)
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					name := "func literal"
					if vs, ok := spec.(*ast.ValueSpec); ok {
						name = vs.Names[0].Name + " (func literal)"
					}
					ast.Inspect(spec, func(n ast.Node) bool {
						if lit, ok := n.(*ast.FuncLit); ok {
							long(name, lit.Pos(), lit.Body)
							return false
						}
						return true
					})
				}
			}
		}
	}
	return r
}
