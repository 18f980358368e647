// Package wideout is not under methods-under: its 7 methods are not counted.
package wideout

type Out struct{}

func (Out) a()  {}
func (Out) b()  {}
func (Out) c()  {}
func (Out) d()  {}
func (Out) e()  {}
func (*Out) f() {}
func (*Out) g() {}
