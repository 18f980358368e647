package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// The launcher is the agent's own executable started with argv[0] launcherArg0 and
// the policy in policyEnv: it restricts itself with Landlock and the seccomp filter
// (seccomp_linux.go) and executes the runner (argv[1:]), which keeps both. It runs
// from init, before any main, so every binary that starts runners (the agent, serve,
// test binaries) can launch one.
const (
	launcherArg0 = "macfleet-sandbox"
	policyEnv    = "MACFLEET_SANDBOX_POLICY"
	// ExitLauncherFailed is the exit code of a launcher that could not confine or
	// execute the runner; its reason is on stderr.
	ExitLauncherFailed = 125
)

func init() {
	if len(os.Args) < 2 || os.Args[0] != launcherArg0 {
		return
	}
	if enc, ok := os.LookupEnv(policyEnv); ok {
		launch(enc, os.Args[1:])
	}
}

// launch confines this process by the policy encoded in enc and executes argv; it
// never returns.
func launch(enc string, argv []string) {
	// The exec below runs on this thread, the one the filters are certain to be on.
	runtime.LockOSThread()
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "macfleet sandbox: %v\n", err)
		os.Exit(ExitLauncherFailed)
	}
	var p Policy
	if err := json.Unmarshal([]byte(enc), &p); err != nil {
		fail(fmt.Errorf("reading the policy: %w", err))
	}
	// The runner makes its cache directory when missing, but a Landlock rule needs
	// the directory to exist.
	if p.CacheDir != "" {
		if err := os.MkdirAll(p.CacheDir, 0o700); err != nil {
			fail(err)
		}
	}
	if err := landlockConfig(p).BestEffort().Restrict(landlockRules(p)...); err != nil {
		fail(fmt.Errorf("restricting the runner: %w", err))
	}
	if err := installSocketFilter(p.Loopback, len(p.ConnectPorts) > 0); err != nil {
		fail(err)
	}
	env := make([]string, 0, len(os.Environ()))
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, policyEnv+"=") {
			env = append(env, kv)
		}
	}
	fail(fmt.Errorf("executing %s: %w", argv[0], syscall.Exec(argv[0], argv, env)))
}

// landlockConfig handles every access right this module knows: what the kernel does
// not know is dropped by BestEffort, and Status says what remains. A loopback runner
// may bind a TCP port (any: it asks for port 0); nothing may connect.
func landlockConfig(p Policy) landlock.Config {
	cfg := landlock.V11
	if p.Loopback {
		cfg.HandledAccessNet &^= ll.AccessNetBindTCP
	}
	return cfg
}

// System paths every runner reads: the dynamic loader's cache and the shared
// libraries, the time zone, and what the Go runtime and the engine read about the
// machine (CPU topology and features, cgroup CPU quota, huge page size, listen
// backlog, the overcommit policy malloc reads). None holds a secret; a missing one is
// skipped. Found by tracing a runner's opens (strace -f -e trace=%file).
var (
	systemDirs = []string{"/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/share/zoneinfo",
		"/sys/devices/system/cpu", "/sys/fs/cgroup", "/sys/kernel/mm/transparent_hugepage"}
	systemFiles = []string{"/etc/ld.so.cache", "/etc/localtime", "/proc/cpuinfo", "/proc/sys/net/core/somaxconn",
		"/proc/sys/vm/overcommit_memory", "/dev/urandom"}
)

// landlockRules are the grants of p. /proc/self is resolved by the launcher, whose
// pid the runner keeps across the exec: the runner reads its own /proc entries only.
func landlockRules(p Policy) []landlock.Rule {
	rules := []landlock.Rule{
		landlock.ROFiles(p.Runner),
		landlock.PathAccess(ll.AccessFSReadFile, p.Model).IgnoreIfMissing(),
		landlock.RWDirs(p.SocketDir),
		landlock.RWFiles("/dev/null"),
		landlock.RODirs("/proc/self"),
		landlock.RODirs(systemDirs...).IgnoreIfMissing(),
		landlock.ROFiles(systemFiles...).IgnoreIfMissing(),
	}
	if p.CacheDir != "" {
		rules = append(rules, landlock.RWDirs(p.CacheDir))
	}
	for _, port := range p.ConnectPorts {
		rules = append(rules, landlock.ConnectTCP(port))
	}
	return rules
}

var probeOnce = sync.OnceValue(func() Status {
	abi, err := ll.LandlockGetABIVersion()
	if err != nil || abi < 1 {
		return Status{Mechanism: "seccomp", Detail: "the kernel has no Landlock (Linux 5.13 or later with landlock among " +
			"the boot's lsm= modules): runners may read and write any file the agent may; the seccomp filter still keeps " +
			"them off the network, and their environment is scrubbed"}
	}
	what := "files"
	if abi >= 4 {
		what += ", TCP"
	} else {
		what += " (not TCP: needs Landlock ABI 4)"
	}
	if abi >= 6 {
		what += ", signals and abstract unix sockets"
	}
	if abi >= 9 {
		what += ", pathname unix sockets"
	}
	if abi >= 10 {
		what += ", UDP"
	}
	return Status{Mechanism: "landlock", Enforced: true, Detail: fmt.Sprintf("Landlock ABI %d confines %s; "+
		"a seccomp filter allows unix stream sockets only and no connect", abi, what)}
})

// Probe reports what Landlock enforces on this kernel (Enforced: the files are
// confined; the seccomp filter applies in any case).
func Probe() Status { return probeOnce() }

// Wrap makes cmd start the runner through the launcher, confined by p. cmd.Env must
// already be the runner's (see Env). Without Landlock, the launcher still installs
// the seccomp filter.
func Wrap(cmd *exec.Cmd, p Policy) error {
	// A missing runner is the exec's error, not a failure inside the launcher.
	if _, err := os.Stat(p.Runner); err != nil {
		return err
	}
	enc, err := json.Marshal(p)
	if err != nil {
		return err
	}
	cmd.Args = append([]string{launcherArg0, cmd.Path}, cmd.Args[1:]...)
	cmd.Path = "/proc/self/exe"
	cmd.Env = append(cmd.Env, policyEnv+"="+string(enc))
	return nil
}
