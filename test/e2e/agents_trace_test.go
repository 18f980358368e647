package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/macfleet/macfleet/test/support/clientrecord"
)

// The coding agents must send nothing off this machine: when strace is installed,
// each turn runs under it and every address a client (or a helper it starts) connects
// or sends to must be on this machine, DNS resolvers included.

// traceNetwork wraps a client command line in strace when strace is installed and
// returns the new command line and the trace file ("" without strace).
func traceNetwork(t *testing.T, bin string, args []string) (string, []string, string) {
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Logf("strace is not installed: the clients' network use is not checked")
		return bin, args, ""
	}
	// Where ptrace is not allowed (some containers) strace cannot run anything.
	if out, err := exec.CommandContext(t.Context(), strace, append(clientrecord.StraceArgs(os.DevNull), "true")...).CombinedOutput(); err != nil {
		t.Logf("strace cannot trace here (%v: %s): the clients' network use is not checked", err, out)
		return bin, args, ""
	}
	trace := filepath.Join(t.TempDir(), "strace.out")
	return strace, append(append(clientrecord.StraceArgs(trace), bin), args...), trace
}

// checkNetwork fails the test when the trace shows traffic off this machine.
func checkNetwork(t *testing.T, what, trace string) {
	t.Helper()
	if trace == "" {
		return
	}
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Errorf("%s: reading its network trace: %v", what, err)
		return
	}
	if addrs := clientrecord.OffHostAddrs(b); len(addrs) > 0 {
		t.Errorf("%s reached beyond this machine: %v (strace of connect and send calls; DNS lookups count)", what, addrs)
	} else {
		t.Logf("%s reached nothing beyond this machine (strace)", what)
	}
}
