package main

import (
	"fmt"
	"go/ast"
	"go/types"
	"path"
	"slices"
	"strings"

	"golang.org/x/tools/go/packages"
)

// walker follows the static calls from a root function through the functions of one
// package, depth first in the order the code runs them, and records each file control
// passes through: the callee's when a call enters a function of the package, the
// caller's again when it returns (an Euler tour of the call tree). Calls are resolved
// with the package's types, methods reached through fields (p.loader.await) included;
// a function value passed or stored is not followed, and each function is expanded
// once: a later call of it enters its file and returns without walking it again.
// Function literals are walked where they are written: one passed to a call after the
// call's callee, as the callee would run it.
type walker struct {
	m        *module
	info     *types.Info
	decls    map[*types.Func]*ast.FuncDecl
	expanded map[*types.Func]bool
	steps    []step
}

// step is control arriving in a file: entering fn, or returning there when fn is "".
type step struct {
	file, fn string
}

// stay is a run of steps in one file.
type stay struct {
	file string
	fns  []string
}

// walkCalls walks w from its root in package p and counts its stays and its returns.
func walkCalls(m *module, p *packages.Package, w walk) (result, result, error) {
	wk := &walker{m: m, info: p.TypesInfo, decls: map[*types.Func]*ast.FuncDecl{}, expanded: map[*types.Func]bool{}}
	var root *types.Func
	want := strings.NewReplacer("(", "", ")", "", "*", "").Replace(w.root)
	for _, f := range p.Syntax {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			fn, ok := p.TypesInfo.Defs[fd.Name].(*types.Func)
			if !ok {
				continue
			}
			wk.decls[fn] = fd
			if funcName(fd) == want {
				root = fn
			}
		}
	}
	stays, returns := result{name: w.name + "-stays"}, result{name: w.name + "-returns"}
	if root == nil {
		return stays, returns, fmt.Errorf("walk %s: no function %s in %s", w.name, w.root, w.pkg)
	}
	wk.steps = append(wk.steps, step{wk.file(root), funcName(wk.decls[root])})
	wk.expand(root)
	seen := map[string]bool{}
	for i, s := range staysOf(wk.steps) {
		line := fmt.Sprintf("stay %d: %s %s", i+1, s.file, strings.Join(s.fns, ", "))
		stays.tour = append(stays.tour, path.Base(s.file))
		stays.offenders = append(stays.offenders, line)
		if seen[s.file] {
			returns.offenders = append(returns.offenders, line)
		}
		seen[s.file] = true
	}
	stays.count, returns.count = len(stays.offenders), len(returns.offenders)
	return stays, returns, nil
}

// staysOf merges the steps into stays, each with the functions entered in it.
func staysOf(steps []step) []stay {
	var out []stay
	for _, s := range steps {
		if len(out) == 0 || out[len(out)-1].file != s.file {
			out = append(out, stay{file: s.file})
		}
		last := &out[len(out)-1]
		if s.fn != "" && !slices.Contains(last.fns, s.fn) {
			last.fns = append(last.fns, s.fn)
		}
	}
	return out
}

// file is the file that declares fn, relative to the module root.
func (w *walker) file(fn *types.Func) string {
	at := w.m.at(w.decls[fn].Pos())
	return at[:strings.LastIndex(at, ":")]
}

// expand walks fn's body.
func (w *walker) expand(fn *types.Func) {
	w.expanded[fn] = true
	w.walk(w.decls[fn].Body, w.file(fn))
}

// walk follows the calls in n, written in file.
func (w *walker) walk(n ast.Node, file string) {
	ast.Inspect(n, func(n ast.Node) bool {
		if call, ok := n.(*ast.CallExpr); ok {
			w.call(call, file)
			return false
		}
		return true
	})
}

// call follows one call: its receiver and arguments first, then the callee, then the
// bodies of the function literals it is given or is.
func (w *walker) call(c *ast.CallExpr, file string) {
	fun := ast.Unparen(c.Fun)
	var lits []*ast.FuncLit
	if sel, ok := fun.(*ast.SelectorExpr); ok {
		w.walk(sel.X, file)
	}
	for _, a := range c.Args {
		if lit, ok := ast.Unparen(a).(*ast.FuncLit); ok {
			lits = append(lits, lit)
		} else {
			w.walk(a, file)
		}
	}
	if lit, ok := fun.(*ast.FuncLit); ok {
		lits = append(lits, lit)
	}
	if callee := w.callee(fun); callee != nil {
		w.steps = append(w.steps, step{w.file(callee), funcName(w.decls[callee])})
		if !w.expanded[callee] {
			w.expand(callee)
		}
		w.steps = append(w.steps, step{file, ""})
	}
	for _, lit := range lits {
		w.walk(lit.Body, file)
	}
}

// callee is the function of the package that fun names, nil for any other.
func (w *walker) callee(fun ast.Expr) *types.Func {
	switch x := fun.(type) {
	case *ast.IndexExpr:
		fun = x.X
	case *ast.IndexListExpr:
		fun = x.X
	}
	var obj types.Object
	switch x := fun.(type) {
	case *ast.Ident:
		obj = w.info.Uses[x]
	case *ast.SelectorExpr:
		if s := w.info.Selections[x]; s != nil {
			obj = s.Obj()
		} else {
			obj = w.info.Uses[x.Sel]
		}
	}
	fn, ok := obj.(*types.Func)
	if !ok {
		return nil
	}
	fn = fn.Origin()
	if w.decls[fn] == nil {
		return nil
	}
	return fn
}
