package main

import (
	"fmt"
	"go/ast"
	"go/types"
	"path"
	"strings"

	"golang.org/x/tools/go/packages"
)

// measurePool loads the pool package and the walks' packages with their types and
// counts the pool's lock sites and …Locked helpers, and each walk's stays and returns.
func measurePool(m *module, cfg config) ([]result, error) {
	rels := []string{cfg.poolPackage}
	for _, w := range cfg.walks {
		rels = append(rels, w.pkg)
	}
	pkgs, err := loadTyped(m, rels)
	if err != nil {
		return nil, err
	}
	pool := pkgs[cfg.poolPackage]
	results := []result{lockSites(m, pool), lockedHelpers(m, pool, cfg.stateType)}
	for _, w := range cfg.walks {
		stays, returns, err := walkCalls(m, pkgs[w.pkg], w, cfg.walkFields)
		if err != nil {
			return nil, err
		}
		results = append(results, stays, returns)
	}
	return results, nil
}

// loadTyped loads the module packages at rels (paths from the module root), without
// their tests, parsed into m's file set and type-checked.
func loadTyped(m *module, rels []string) (map[string]*packages.Package, error) {
	cfg := &packages.Config{
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedCompiledGoFiles |
			packages.NeedSyntax | packages.NeedTypes | packages.NeedTypesInfo,
		Dir:  m.root,
		Fset: m.fset,
	}
	patterns := make([]string, len(rels))
	for i, rel := range rels {
		patterns[i] = m.path + "/" + rel
	}
	loaded, err := packages.Load(cfg, patterns...)
	if err != nil {
		return nil, err
	}
	out := map[string]*packages.Package{}
	for _, p := range loaded {
		if len(p.Errors) > 0 {
			return nil, fmt.Errorf("loading %s: %v", p.PkgPath, p.Errors[0])
		}
		out[strings.TrimPrefix(p.PkgPath, m.path+"/")] = p
	}
	for _, rel := range rels {
		if out[rel] == nil {
			return nil, fmt.Errorf("package %s not found", rel)
		}
	}
	return out, nil
}

// counted are the package's files that the measures count: not generated.
func counted(p *packages.Package) []*ast.File {
	var out []*ast.File
	for _, f := range p.Syntax {
		name := path.Base(p.Fset.Position(f.Package).Filename)
		if !ast.IsGenerated(f) && !strings.HasPrefix(name, "zz_generated") {
			out = append(out, f)
		}
	}
	return out
}

// lockMethods are the methods that take a mutex.
var lockMethods = map[string]bool{
	"(*sync.Mutex).Lock":    true,
	"(*sync.RWMutex).Lock":  true,
	"(*sync.RWMutex).RLock": true,
}

// lockSites counts the calls of Lock and RLock on a sync.Mutex or RWMutex in p.
func lockSites(m *module, p *packages.Package) result {
	r := result{name: "pool-lock-sites"}
	for _, f := range counted(p) {
		for _, d := range f.Decls {
			where := "var"
			if fd, ok := d.(*ast.FuncDecl); ok {
				where = funcName(fd)
			}
			ast.Inspect(d, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
				if !ok || p.TypesInfo.Selections[sel] == nil {
					return true
				}
				if fn, ok := p.TypesInfo.Selections[sel].Obj().(*types.Func); ok && lockMethods[fn.FullName()] {
					r.count++
					r.offenders = append(r.offenders, fmt.Sprintf("%s %s: %s()", m.at(call.Pos()), where, types.ExprString(sel)))
				}
				return true
			})
		}
	}
	return r
}

// lockedHelpers counts the functions of p named …Locked that are not methods of
// stateType.
func lockedHelpers(m *module, p *packages.Package, stateType string) result {
	r := result{name: "locked-helpers-outside-state"}
	for _, f := range counted(p) {
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && strings.HasSuffix(fd.Name.Name, "Locked") && recvName(fd) != stateType {
				r.count++
				r.offenders = append(r.offenders, m.at(fd.Pos())+" "+funcName(fd))
			}
		}
	}
	return r
}
