// Package sub is below wide, so its types are counted: Deep has 5 methods.
package sub

type Deep struct{}

func (Deep) a()  {}
func (Deep) b()  {}
func (*Deep) c() {}
func (*Deep) d() {}
func (*Deep) e() {}
