package main

import (
	"bytes"
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// attackFunc is a top-level test function of the attacks, as gofmt writes one.
var attackFunc = regexp.MustCompile(`(?m)^func (TestAttack\w*)\(`)

// scan is, for each package under root (its own module: directories holding another
// go.mod, testdata and hidden ones are skipped), the TestAttack functions of the test
// files `go test` builds for goos: file name suffixes and build constraints as the go
// command reads them, cgo on; the functions as gofmt writes them (attackFunc).
func scan(root, goos string) (map[string][]string, error) {
	ctx := build.Default
	ctx.GOOS, ctx.CgoEnabled = goos, true
	if goos == "darwin" {
		ctx.GOARCH = "arm64"
	}
	found := map[string][]string{}
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
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		pkg := "./" + filepath.ToSlash(filepath.Dir(path))
		if dir := filepath.Dir(path); dir == "." {
			pkg = "."
		}
		if !bytes.Contains(src, []byte("func TestAttack")) {
			return nil
		}
		for _, m := range attackFunc.FindAllSubmatch(src, -1) {
			found[pkg] = append(found[pkg], string(m[1]))
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
