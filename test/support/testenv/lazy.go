package testenv

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// Lazy is a test package's one API server, started on first use — so that a run of
// only the package's pure tests starts none — and stopped by Run.
type Lazy struct {
	opts []Option
	once sync.Once
	env  *Env
	err  error
}

// NewLazy returns a Lazy that starts its API server with opts.
func NewLazy(opts ...Option) *Lazy { return &Lazy{opts: opts} }

// Get returns the API server, starting it on the first call; it fails tb when the
// server could not start.
func (l *Lazy) Get(tb testing.TB) *Env {
	tb.Helper()
	l.once.Do(func() { l.env, l.err = New(l.opts...) })
	if l.err != nil {
		tb.Fatal(l.err)
	}
	return l.env
}

// Run is for TestMain: it runs the tests, stops the API server if one started and
// returns the exit code for os.Exit (failed when stopping failed).
func (l *Lazy) Run(m *testing.M) int {
	code := m.Run()
	if err := l.stop(); err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func (l *Lazy) stop() error {
	if l.env == nil {
		return nil
	}
	return l.env.Stop()
}
