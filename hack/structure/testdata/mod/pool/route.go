package pool

// Route is the followed walk's root: its model goes to find (route.go), then as e to
// admit (admit.go), which hands e.name back to find (route.go) and e to settle
// (admit.go); count is never passed the model, nor find the other names, so neither
// call is entered, and a range over a list made of the model tracks each name into
// find (a call to a function already passed: its file again, not walked twice).
// Tour: route.go → admit.go → route.go → admit.go → route.go (5 stays, 3 returns).
func (p *Pool) Route(model string, names []string) int {
	for _, name := range names {
		_ = p.find(name) // names are not the model: not entered
	}
	e := p.find(model)
	n := count(3)
	admit(e)
	for _, name := range []string{model, model + "-b"} {
		_ = p.find(name)
	}
	return n
}

type item struct{ name string }

func (p *Pool) find(name string) *item { return &item{name: name} }

func count(n int) int { return n + 1 }
