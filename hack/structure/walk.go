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
// call's callee, as the callee would run it. A call through a field of function type
// enters the functions of the package that the package stores in that field
// (`Pool{startLoad: l.start}`, `p.startLoad = l.start`), in the order they are stored
// (the limits file's walk-fields turns this off).
type walker struct {
	m        *module
	info     *types.Info
	decls    map[*types.Func]*ast.FuncDecl
	stored   map[*types.Var][]*types.Func // a func-typed field's functions
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

// walkCalls walks w from its root in package p and counts its stays and its returns;
// with fields, calls through func-typed fields enter the functions stored there.
func walkCalls(m *module, p *packages.Package, w walk, fields bool) (result, result, error) {
	wk := &walker{m: m, info: p.TypesInfo, decls: map[*types.Func]*ast.FuncDecl{},
		stored: map[*types.Var][]*types.Func{}, expanded: map[*types.Func]bool{}}
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
	for _, f := range p.Syntax {
		if fields {
			wk.findStored(f)
		}
	}
	stays, returns := result{name: w.name + "-stays"}, result{name: w.name + "-returns"}
	if root == nil {
		return stays, returns, fmt.Errorf("walk %s: no function %s in %s", w.name, w.root, w.pkg)
	}
	if w.param != "" {
		p := param(root, w.param)
		if p == nil {
			return stays, returns, fmt.Errorf("walk %s: %s has no parameter %s", w.name, w.root, w.param)
		}
		(&follower{walker: wk, tracked: map[types.Object]bool{}}).enter(root, []types.Object{p})
	} else {
		wk.steps = append(wk.steps, step{wk.file(root), funcName(wk.decls[root])})
		wk.expand(root)
	}
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
	for _, callee := range w.callees(fun) {
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

// callees are the functions of the package that a call of fun enters: the one it
// names, or those stored in the func-typed field it names; none for any other.
func (w *walker) callees(fun ast.Expr) []*types.Func {
	obj := w.object(fun)
	if v, ok := obj.(*types.Var); ok && v.IsField() {
		return w.stored[v.Origin()]
	}
	if fn := w.function(obj); fn != nil {
		return []*types.Func{fn}
	}
	return nil
}

// object is what the expression e names: a function, a method, a field, a variable.
func (w *walker) object(e ast.Expr) types.Object {
	switch x := ast.Unparen(e).(type) {
	case *ast.IndexExpr:
		return w.object(x.X)
	case *ast.IndexListExpr:
		return w.object(x.X)
	case *ast.Ident:
		return w.info.Uses[x]
	case *ast.SelectorExpr:
		if s := w.info.Selections[x]; s != nil {
			return s.Obj()
		}
		return w.info.Uses[x.Sel]
	}
	return nil
}

// function is obj if it is a function of the package with a body, else nil.
func (w *walker) function(obj types.Object) *types.Func {
	fn, ok := obj.(*types.Func)
	if !ok || w.decls[fn.Origin()] == nil {
		return nil
	}
	return fn.Origin()
}

// findStored records the functions of the package that f stores in func-typed
// fields, by a keyed composite literal or an assignment.
func (w *walker) findStored(f *ast.File) {
	store := func(field, value ast.Expr) {
		v, ok := w.object(field).(*types.Var)
		fn := w.function(w.object(value))
		if ok && v.IsField() && fn != nil && !slices.Contains(w.stored[v.Origin()], fn) {
			w.stored[v.Origin()] = append(w.stored[v.Origin()], fn)
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.KeyValueExpr:
			store(n.Key, n.Value)
		case *ast.AssignStmt:
			if len(n.Lhs) == len(n.Rhs) {
				for i := range n.Lhs {
					store(n.Lhs[i], n.Rhs[i])
				}
			}
		}
		return true
	})
}
