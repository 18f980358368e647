package main

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// scan is, for each package under root (its own module: directories holding another
// go.mod, testdata and hidden ones are skipped), the TestAttack functions of the test
// files `go test` builds for goos: file name suffixes and build constraints as the go
// command reads them, cgo on.
func scan(root, goos string) (map[string][]string, error) {
	ctx := build.Default
	ctx.GOOS, ctx.CgoEnabled = goos, true
	if goos == "darwin" {
		ctx.GOARCH = "arm64"
	}
	found := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || hasGoMod(path)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		if ok, err := ctx.MatchFile(filepath.Dir(path), d.Name()); err != nil || !ok {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := "./" + filepath.ToSlash(filepath.Dir(path))
		if dir := filepath.Dir(path); dir == "." {
			pkg = "."
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "TestAttack") {
				found[pkg] = append(found[pkg], fn.Name.Name)
			}
		}
		return nil
	})
	for _, tests := range found {
		slices.Sort(tests)
	}
	return found, err
}

func hasGoMod(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}
