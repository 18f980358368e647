package wide

func (w *Wide) d()     { w.n++ }
func (w *Wide) e() int { return w.n }
