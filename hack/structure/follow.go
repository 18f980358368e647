package main

import (
	"go/ast"
	"go/types"
)

// follower walks the journey of one value instead of every call: from a parameter of
// the root, the calls of the package's functions that are passed that value or one
// made from it (a variable assigned from an expression that mentions it, a range
// over it), entering the callee as the parameters it is passed as (the receiver
// too, when the call's receiver mentions it). Steps are the functions entered, in
// the order the code is written (a call back to a function already passed enters
// its file again, without walking it twice); coming back to a caller is not a step:
// a stay is a run of functions entered in one file, and a return is a stay in a file
// an earlier stay had. Function literals are walked where they are written, with the
// values they close over.
type follower struct {
	*walker
	tracked map[types.Object]bool
}

// enter records fn as the next step, tracks its parameters params, and walks its
// body once.
func (f *follower) enter(fn *types.Func, params []types.Object) {
	f.steps = append(f.steps, step{f.file(fn), funcName(f.decls[fn])})
	for _, o := range params {
		f.tracked[o] = true
	}
	if f.expanded[fn] {
		return
	}
	f.expanded[fn] = true
	f.body(f.decls[fn].Body)
}

// body follows the value through n: the calls it is passed to, and the variables
// made from it.
func (f *follower) body(n ast.Node) {
	ast.Inspect(n, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.CallExpr:
			f.call(x)
			return false
		case *ast.AssignStmt:
			f.assign(x.Lhs, x.Rhs)
			return false
		case *ast.ValueSpec:
			lhs := make([]ast.Expr, len(x.Names))
			for i, id := range x.Names {
				lhs[i] = id
			}
			f.assign(lhs, x.Values)
			return false
		case *ast.RangeStmt:
			f.body(x.X)
			if f.mentions(x.X) {
				f.track(x.Key)
				f.track(x.Value)
			}
			f.body(x.Body)
			return false
		}
		return true
	})
}

// assign walks the right-hand sides, then tracks each left-hand variable assigned
// from one that mentions the value (every one of them, for a call's several results).
func (f *follower) assign(lhs, rhs []ast.Expr) {
	for _, r := range rhs {
		f.body(r)
	}
	for i, l := range lhs {
		switch {
		case len(lhs) == len(rhs) && f.mentions(rhs[i]):
			f.track(l)
		case len(lhs) != len(rhs) && len(rhs) == 1 && f.mentions(rhs[0]):
			f.track(l)
		}
	}
}

// track tracks the variable e names, if it names one.
func (f *follower) track(e ast.Expr) {
	id, ok := e.(*ast.Ident)
	if !ok || id.Name == "_" {
		return
	}
	if o := f.info.Defs[id]; o != nil {
		f.tracked[o] = true
	} else if o := f.info.Uses[id]; o != nil {
		f.tracked[o] = true
	}
}

// mentions says whether e uses a tracked variable.
func (f *follower) mentions(e ast.Node) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && f.tracked[f.info.Uses[id]] {
			found = true
		}
		return !found
	})
	return found
}

// call follows one call: the calls in its receiver and arguments first, then the
// callee if it is passed the value, then the function literals it is given or is.
func (f *follower) call(c *ast.CallExpr) {
	fun := ast.Unparen(c.Fun)
	var lits []*ast.FuncLit
	sel, isSel := fun.(*ast.SelectorExpr)
	if isSel {
		f.body(sel.X)
	}
	for _, a := range c.Args {
		if lit, ok := ast.Unparen(a).(*ast.FuncLit); ok {
			lits = append(lits, lit)
		} else {
			f.body(a)
		}
	}
	if lit, ok := fun.(*ast.FuncLit); ok {
		lits = append(lits, lit)
	}
	recv := isSel && f.info.Selections[sel] != nil && f.info.Selections[sel].Kind() == types.MethodVal && f.mentions(sel.X)
	for _, callee := range f.callees(fun) {
		if params := f.passed(callee, c, recv); len(params) > 0 {
			f.enter(callee, params)
		}
	}
	for _, lit := range lits {
		f.body(lit.Body)
	}
}

// passed is the parameters of callee that call c passes the value as: those whose
// argument mentions it, and the receiver when recv says the call's receiver does.
func (f *follower) passed(callee *types.Func, c *ast.CallExpr, recv bool) []types.Object {
	sig, ok := callee.Type().(*types.Signature)
	if !ok {
		return nil
	}
	var out []types.Object
	if recv && sig.Recv() != nil {
		out = append(out, sig.Recv())
	}
	n := sig.Params().Len()
	for i, a := range c.Args {
		if n == 0 || !f.mentions(a) {
			continue
		}
		out = append(out, sig.Params().At(min(i, n-1)))
	}
	return out
}

// param is the parameter of fn named name, or nil.
func param(fn *types.Func, name string) types.Object {
	sig, ok := fn.Type().(*types.Signature)
	if !ok {
		return nil
	}
	for i := range sig.Params().Len() {
		if p := sig.Params().At(i); p.Name() == name {
			return p
		}
	}
	return nil
}
