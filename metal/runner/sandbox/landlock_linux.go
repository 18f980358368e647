package sandbox

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"

	"github.com/macfleet/macfleet/api/runnerapi"
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
	// A backend directory without a backend (a CPU runner's) grants nothing.
	if !runnerapi.HoldsBackend(p.BackendDir, runtime.GOOS) {
		p.BackendDir = ""
	}
	if p.LandlockABI > 0 {
		if err := landlockConfig(p).BestEffort().Restrict(landlockRules(p, existing)...); err != nil {
			fail(fmt.Errorf("restricting the runner: %w", err))
		}
	}
	if err := installSocketFilter(p); err != nil {
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

// landlockVersions are go-landlock's configurations by ABI: each handles the access
// rights its ABI knows.
var landlockVersions = [...]landlock.Config{1: landlock.V1, 2: landlock.V2, 3: landlock.V3, 4: landlock.V4,
	5: landlock.V5, 6: landlock.V6, 7: landlock.V7, 8: landlock.V8, 9: landlock.V9, 10: landlock.V10, 11: landlock.V11}

// landlockConfig handles every access right of p.LandlockABI (1 or more) that this
// module knows: what the kernel does not know is dropped by BestEffort, and Status
// says what remains. A loopback runner may bind a TCP port (any: it asks for port 0);
// nothing may connect but to p.ConnectPorts.
func landlockConfig(p Policy) landlock.Config {
	cfg := landlockVersions[max(1, min(p.LandlockABI, len(landlockVersions)-1))]
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

// gpuAccess is what a GPU runner may do with the paths of one gpuPaths entry.
type gpuAccess int

const (
	// device: open a character device to read and write it, and its ioctls (which
	// Landlock confines on device files from ABI 5); nothing else is done with a
	// device.
	device gpuAccess = iota
	// readTree: list and read what is beneath a directory.
	readTree
	// readFile: read one file.
	readFile
	// writeTree: write (and truncate) the files beneath a directory, not create
	// or remove any.
	writeTree
)

// gpuPaths are what a runner whose backend directory holds an accelerator backend
// may touch besides a CPU runner's paths (glob patterns; those that match nothing on
// this machine are left out). Each is what a vendor's user-space driver opens to
// find and drive its cards; nothing here holds a secret, and nothing but the
// devices and the runner's own thread names may be written. The NVIDIA rules were
// traced from a CUDA program on an H100; the AMD, Vulkan and MIG ones are untried.
var gpuPaths = []struct {
	pattern string
	access  gpuAccess
}{
	// NVIDIA (CUDA): the control device every context opens first,
	{"/dev/nvidiactl", device},
	// one device per card,
	{"/dev/nvidia[0-9]*", device},
	// unified memory, through which the CUDA driver maps its allocations,
	{"/dev/nvidia-uvm", device},
	// the capabilities of MIG partitions (a card split into several), which the
	// driver opens to reach a partition,
	{"/dev/nvidia-caps/*", device},
	// the driver's version, parameters and one information file per card,
	{"/proc/driver/nvidia", readTree},
	// the character devices' major numbers (the driver finds unified memory's),
	{"/proc/devices", readFile},
	// the lowest address a mapping may take and the size of a memory block, which
	// the driver reads before it reserves its address range,
	{"/proc/sys/vm/mmap_min_addr", readFile},
	{"/sys/devices/system/memory/block_size_bytes", readFile},
	// the runner's own threads (/proc/self is the launcher's, whose pid the runner
	// keeps), which the driver names as it starts them, writing their comm: it
	// fails to start when it cannot ("OS call failed or operation not supported on
	// this OS"). What else a thread's directory holds that can be written affects
	// that thread only.
	{"/proc/self/task", writeTree},
	// AMD (ROCm): the compute driver, and the render nodes of every card (which a
	// Vulkan backend also uses), and the compute driver's topology
	// (/sys/class/kfd links there).
	{"/dev/kfd", device},
	{"/dev/dri/renderD*", device},
	{"/sys/devices/virtual/kfd", readTree},
	// Vulkan: the loader's driver manifests (which library serves which card).
	{"/usr/share/vulkan/icd.d", readTree},
	{"/etc/vulkan/icd.d", readTree},
	// Every vendor: the PCI devices (links into /sys/devices/pci*) and the PCI
	// hierarchies themselves, where a driver reads each card's NUMA node and
	// nearby CPUs, and the NUMA nodes' CPUs. Not all of /sys/devices: that adds
	// every virtual device (network interfaces, block devices, terminals), which no
	// driver reads.
	{"/sys/bus/pci/devices", readTree},
	{"/sys/devices/pci*", readTree},
	{"/sys/devices/system/node", readTree},
	// Driver and runtime libraries outside the system library directories: where
	// a container runtime mounts the driver's (libcuda), and the toolkit's runtime
	// libraries a backend links to (libcudart, libcublas). The loader finds them
	// through /etc/ld.so.cache, which every runner reads.
	{"/usr/local/nvidia/lib64", readTree},
	{"/usr/local/cuda*/lib64", readTree},
}

// existing is filepath.Glob, the paths on this machine that pattern matches.
func existing(pattern string) []string {
	paths, _ := filepath.Glob(pattern) // the patterns are fixed: never ErrBadPattern
	return paths
}

// landlockRules are the grants of p. /proc/self is resolved by the launcher, whose
// pid the runner keeps across the exec: the runner reads its own /proc entries only.
// A runner with a backend directory (see runnerapi.HoldsBackend) also gets that directory
// (read) and gpuPaths, those that found (existing, in tests a fake) says exist.
func landlockRules(p Policy, found func(pattern string) []string) []landlock.Rule {
	rules := []landlock.Rule{
		landlock.ROFiles(p.Runner),
		landlock.PathAccess(ll.AccessFSReadFile, p.Model).IgnoreIfMissing(),
		landlock.RWDirs(p.SocketDir),
		landlock.RWFiles("/dev/null"),
		landlock.RODirs("/proc/self"),
		landlock.RODirs(systemDirs...).IgnoreIfMissing(),
		landlock.ROFiles(systemFiles...).IgnoreIfMissing(),
	}
	if len(p.Parts) > 0 {
		// A part's rule is on the file its link (if any) resolves to.
		rules = append(rules, landlock.PathAccess(ll.AccessFSReadFile, p.Parts...).IgnoreIfMissing())
	}
	if p.CacheDir != "" {
		rules = append(rules, landlock.RWDirs(p.CacheDir))
	}
	// Below ABI 4 nothing handles connects to grant them on (a runner with
	// ConnectPorts runs there only with AllowUnconfinedFlag).
	if landlockConfig(p).HandledAccessNet&ll.AccessNetConnectTCP != 0 {
		for _, port := range p.ConnectPorts {
			rules = append(rules, landlock.ConnectTCP(port))
		}
	}
	if p.BackendDir == "" {
		return rules
	}
	// Mapping a library executable (dlopen) is reading it to Landlock: its execute
	// right is execve's, which nothing here needs.
	const (
		readDir  = ll.AccessFSReadFile | ll.AccessFSReadDir
		readOnly = ll.AccessFSReadFile
		useDev   = ll.AccessFSReadFile | ll.AccessFSWriteFile | ll.AccessFSIoctlDev
		write    = ll.AccessFSWriteFile | ll.AccessFSTruncate
	)
	rules = append(rules, landlock.PathAccess(readDir, p.BackendDir))
	var byAccess [4][]string
	for _, g := range gpuPaths {
		byAccess[g.access] = append(byAccess[g.access], found(g.pattern)...)
	}
	for a, rights := range [...]landlock.AccessFSSet{device: useDev, readTree: readDir, readFile: readOnly, writeTree: write} {
		if len(byAccess[a]) > 0 {
			rules = append(rules, landlock.PathAccess(rights, byAccess[a]...).IgnoreIfMissing())
		}
	}
	return rules
}

// kernelABI is the Landlock ABI of this kernel; 0 without Landlock.
var kernelABI = sync.OnceValue(func() int {
	abi, err := ll.LandlockGetABIVersion()
	if err != nil {
		return 0
	}
	return max(abi, 0)
})

// landlockABI is the ABI the sandbox uses: the kernel's, capped by LandlockABIEnv
// (its note says so when it lowers it).
func landlockABI() (abi int, note string) {
	abi = kernelABI()
	s, ok := os.LookupEnv(LandlockABIEnv)
	if !ok || s == "" {
		return abi, ""
	}
	capped, err := strconv.Atoi(s)
	if err != nil || capped < 0 {
		capped = 0
	}
	if capped >= abi {
		return abi, ""
	}
	return capped, fmt.Sprintf(" (%s=%s caps the kernel's ABI %d)", LandlockABIEnv, s, abi)
}

// probe reports what Landlock enforces on this kernel (Enforced: the files are
// confined; the seccomp filter applies in any case).
func probe() Status { return landlockStatus(landlockABI()) }

// landlockStatus is what the sandbox enforces with Landlock ABI abi (0: none); note
// is appended to the ABI's name.
func landlockStatus(abi int, note string) Status {
	if abi < 1 {
		return Status{Mechanism: "seccomp", Detail: "the kernel has no Landlock" + note + " (Linux 5.13 or later with " +
			"landlock among the boot's lsm= modules): runners may read and write any file the agent may; the seccomp " +
			"filter still keeps them off the network, and their environment is scrubbed"}
	}
	what := "files"
	if abi >= connectABI {
		what += ", TCP"
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
	detail := fmt.Sprintf("Landlock ABI %d%s confines %s; a seccomp filter allows unix stream sockets only (a GPU "+
		"runner's also seqpacket ones) and no connect", abi, note, what)
	if abi < connectABI {
		detail = fmt.Sprintf("Landlock ABI %d%s confines files but not TCP connects (Landlock ABI %d, %s): a seccomp "+
			"filter allows unix stream sockets only (a GPU runner's also seqpacket ones) and no connect, so every runner "+
			"is off the network but a split replica's, which must connect to its workers and is refused (%s runs it "+
			"with TCP connects unconfined)", abi, note, connectABI, connectKernel, AllowUnconfinedFlag)
	}
	return Status{Mechanism: "landlock", Enforced: true, ConnectConfined: abi >= connectABI, Detail: detail}
}

// Wrap makes cmd start the runner through the launcher, confined by p. cmd.Env must
// already be the runner's (see Env). Without Landlock, the launcher still installs
// the seccomp filter.
func Wrap(cmd *exec.Cmd, p Policy) error {
	// A missing runner is the exec's error, not a failure inside the launcher.
	if _, err := os.Stat(p.Runner); err != nil {
		return err
	}
	// The launcher applies what Probe reports, no more.
	p.LandlockABI, _ = landlockABI()
	enc, err := json.Marshal(p)
	if err != nil {
		return err
	}
	cmd.Args = append([]string{launcherArg0, cmd.Path}, cmd.Args[1:]...)
	cmd.Path = "/proc/self/exe"
	cmd.Env = append(cmd.Env, policyEnv+"="+string(enc))
	return nil
}
