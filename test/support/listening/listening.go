// Package listening starts a runner or split worker process for a test and reads the
// listener it announces: its first line of output is a runnerapi.ListeningEvent. The
// process is killed when the test ends, and its standard error logged if the test
// failed.
package listening

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/test/support/syncbuf"
)

// announceTimeout bounds the wait for the process's listener.
const announceTimeout = 30 * time.Second

// Proc is a started process that announced its listener.
type Proc struct {
	// Addr is the address it listens on (host:port).
	Addr string
	// Stderr is what it wrote to standard error so far.
	Stderr *syncbuf.Buffer
	// Exited is closed when the process has exited.
	Exited <-chan struct{}
}

// Start starts cmd (its Stdout and Stderr unset), waits for its ListeningEvent and
// returns it; the test fails if the process does not announce one within 30 s.
func Start(t *testing.T, name string, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{Stderr: &syncbuf.Buffer{}}
	cmd.Stderr = p.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	p.Exited = exited
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("%s stderr:\n%s", name, p.Stderr.String())
		}
	})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		for sc.Scan() { // later lines, unread
		}
	}()
	select {
	case l, ok := <-line:
		var ev runnerapi.ListeningEvent
		if !ok || json.Unmarshal([]byte(l), &ev) != nil || ev.Addr == "" {
			t.Fatalf("%s's first line %q is not its listener; stderr:\n%s", name, l, p.Stderr.String())
		}
		p.Addr = ev.Addr
	case <-time.After(announceTimeout):
		t.Fatalf("%s did not announce its listener within %s; stderr:\n%s", name, announceTimeout, p.Stderr.String())
	}
	return p
}
