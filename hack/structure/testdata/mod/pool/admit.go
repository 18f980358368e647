package pool

func admit(e *item) {
	var p *Pool
	_ = p.find(e.name)
	settle(e)
}

func settle(e *item) { _ = e }
