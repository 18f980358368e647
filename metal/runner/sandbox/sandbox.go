// Package sandbox confines each runner process (the llama.cpp engine that parses a
// tenant's GGUF file) to what it needs: its model file, or each file of a model stored
// in parts (read), its prompt-cache directory and its socket directory (read and write), its own binary and the system
// libraries, and no network; a runner with an accelerator backend also its backend
// libraries and what its card's driver opens. The agent's environment is scrubbed on
// the way in, so a runner never holds the agent's KUBECONFIG or token variables.
//
// On Linux the confinement is Landlock: the agent starts a short-lived launcher (its
// own executable, see Wrap) that restricts itself and then executes the runner, which
// inherits the restriction. On macOS it is a Seatbelt profile (Profile) run by
// sandbox-exec. The agent process itself is never restricted.
//
// docs/security.md ("6. Runner processes") lists what each runner may touch.
package sandbox

import (
	"fmt"
	"os"
	"strings"
)

// Mode says whether runners are confined.
type Mode string

const (
	// On confines every runner (the default). Where the machine cannot (Linux
	// without Landlock, macOS without sandbox-exec), no runner starts
	// (UnconfinedError) unless the operator allows it by name
	// (--allow-unconfined-runners): then runners start unconfined but with a scrubbed
	// environment, and the factory reports AllowedUnconfined.
	On Mode = "on"
	// Off starts runners as the agent's children with the agent's environment.
	Off Mode = "off"
	// AllowedUnconfined is not a setting: it is how a factory with the sandbox on
	// reports itself (status, metrics) when the machine cannot confine runners and the
	// operator allowed them to run unconfined.
	AllowedUnconfined Mode = "allow-unconfined"
)

// AllowUnconfinedFlag is the flag of `macfleet agent` and `macfleet serve` (and
// allowUnconfinedRunners of serve's config file) that lets runners start where the
// sandbox is unavailable.
const AllowUnconfinedFlag = "--allow-unconfined-runners"

// UnavailableEnv, when set in the agent's environment, makes Probe report the sandbox
// unavailable whatever the machine could do: the seam that lets a test (or an
// operator checking the refusal) see what a machine without Landlock or sandbox-exec
// does. It can only take confinement away, never grant it.
const UnavailableEnv = "MACFLEET_SANDBOX_UNAVAILABLE"

// LandlockABIEnv, set to N in the agent's environment, caps the Landlock ABI that
// Probe reports and the launcher applies on Linux at N (0, or a value that is not a
// number: none): the seam that shows what an older kernel does (Landlock ABI 1 to 3
// confines files but not TCP). Like UnavailableEnv, it can only take confinement
// away: a cap above the kernel's ABI changes nothing.
const LandlockABIEnv = "MACFLEET_SANDBOX_LANDLOCK_ABI"

// connectABI is the first Landlock ABI that confines TCP connects, and the Linux
// release that brought it.
const (
	connectABI    = 4
	connectKernel = "Linux 6.7"
)

// UnconfinedError is a runner refused because the machine cannot confine it and the
// operator did not allow unconfined runners.
type UnconfinedError struct {
	// Detail is why the sandbox is unavailable (Status.Detail).
	Detail string
}

func (e *UnconfinedError) Error() string {
	return "the runner sandbox is unavailable (" + e.Detail + "), so no runner starts: a runner parses a tenant's model file, " +
		"and unconfined it could read the agent's credentials and reach the network. Fix the sandbox (Landlock: Linux 5.13 or " +
		"later with landlock in the LSM list; macOS: /usr/bin/sandbox-exec), or start the agent with " + AllowUnconfinedFlag +
		" (on macfleet agent or macfleet serve) to run runners unconfined"
}

// ConnectUnconfinedError is a runner that connects to other runners over loopback TCP
// (a split replica's head, or a split worker that hands on to the next) refused
// because the sandbox confines its files but not its TCP connects (Landlock before
// ABI 4), and the operator did not allow unconfined runners.
type ConnectUnconfinedError struct {
	// Detail is what the sandbox enforces (Status.Detail).
	Detail string
}

func (e *ConnectUnconfinedError) Error() string {
	return fmt.Sprintf("the runner sandbox cannot confine TCP connects (%s), so no split replica's head or chained split "+
		"worker starts: it connects to its workers' loopback ports, and unconfined it could connect to any TCP port, on "+
		"this machine or beyond. Confining them needs Landlock ABI %d (%s or later); or start the agent with %s "+
		"(on macfleet agent or macfleet serve) to run them with TCP connects unconfined", e.Detail, connectABI, connectKernel,
		AllowUnconfinedFlag)
}

// CheckConnect says why a runner that connects to ports (Policy.ConnectPorts) may not
// start where the sandbox is st: st confines files but not TCP connects. nil for a
// runner that connects nowhere, where connects are confined, and where nothing is
// (that is UnconfinedError's refusal).
func CheckConnect(st Status, ports []uint16) error {
	if len(ports) == 0 || !st.Enforced || st.ConnectConfined {
		return nil
	}
	return &ConnectUnconfinedError{Detail: st.Detail}
}

// Probe reports what the sandbox enforces on this machine: nothing while
// UnavailableEnv is set.
func Probe() Status {
	if os.Getenv(UnavailableEnv) != "" {
		return Status{Detail: UnavailableEnv + " is set: the sandbox is treated as unavailable"}
	}
	return probe()
}

// ParseMode reads a --runner-sandbox value; empty is On.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", On:
		return On, nil
	case Off:
		return Off, nil
	}
	return "", fmt.Errorf("runner sandbox %q: want %q or %q", s, On, Off)
}

// Policy is what one runner may touch. Paths are absolute.
type Policy struct {
	// Runner is the runner binary: read and execute.
	Runner string
	// Model is the model file: read only.
	Model string
	// Parts are the model's other files when Model is the first part of a model
	// stored in parts (OtherParts): read only, each as Model, and nothing beside them.
	Parts []string `json:",omitempty"`
	// CacheDir is the runner's prompt-cache directory (read, write, create, remove);
	// empty when the runner has no SSD tier.
	CacheDir string
	// SocketDir is the runner's private directory holding its unix socket.
	SocketDir string
	// Loopback lets the runner listen on a TCP port (the benchmark mode that serves
	// on 127.0.0.1); it still may not connect anywhere.
	Loopback bool
	// ConnectPorts are the loopback TCP ports a split replica's head runner connects
	// to (its workers, through the agent's split link); none for any other runner.
	// Seatbelt allows localhost on these ports only; on Linux, Landlock (ABI 4) allows
	// connecting to these ports only, and cannot tell loopback from other hosts.
	// Below ABI 4 nothing would hold them: such a runner is refused (CheckConnect).
	ConnectPorts []uint16 `json:",omitempty"`
	// LandlockABI is the Landlock ABI the launcher applies on Linux, the one Probe
	// reports (LandlockABIEnv may cap it): 0 applies none. Wrap sets it.
	LandlockABI int `json:",omitempty"`
	// BackendDir is the directory the runner loads accelerator backends from (ggml's
	// dynamic backend libraries): read only; empty for none. It, and on Linux what
	// an accelerator needs besides (gpuPaths in landlock_linux.go), is granted only
	// while the directory holds a backend library (runnerapi.HoldsBackend): a runner without
	// one gets a CPU runner's rules.
	BackendDir string `json:",omitempty"`
	// MetalCacheDir is the runner's own Darwin user cache directory, where Metal
	// keeps the shaders it compiles (com.apple.metal; see metalcache.go): read and
	// write. Wrap makes it on macOS and points the runner at it; empty for none.
	MetalCacheDir string `json:",omitempty"`
}

// Status is what the sandbox enforces on this machine.
type Status struct {
	// Mechanism is "landlock" or "seatbelt"; empty when none is available.
	Mechanism string
	// Enforced is true when runners are confined.
	Enforced bool
	// ConnectConfined is true when a runner's TCP connects are held to its
	// Policy.ConnectPorts (Landlock ABI 4 or later, Seatbelt): without it a runner
	// with ConnectPorts is refused (CheckConnect).
	ConnectConfined bool
	// Detail says what is enforced, or why nothing is.
	Detail string
}

// envAllowed are the variables a runner inherits from the agent: the Go runtime's
// knobs, the time zone of its log lines, and the engine's own (GGML_*) tuning.
var envAllowed = map[string]bool{
	"TZ": true, "GODEBUG": true, "GOGC": true, "GOMAXPROCS": true, "GOMEMLIMIT": true, "GOTRACEBACK": true,
}

const envAllowedPrefix = "GGML_"

// Env is a runner's environment: the variables of parent a runner needs (see
// envAllowed), then extra (the agent's explicit runner environment, KEY=VALUE), which
// wins over parent. No OTEL_* variable passes, tracing or not: a runner's spans reach
// the collector through its agent (package internal/tracing/spanrelay).
func Env(parent, extra []string) []string {
	env := make([]string, 0, len(extra)+4)
	for _, kv := range parent {
		name, _, ok := strings.Cut(kv, "=")
		if ok && (envAllowed[name] || strings.HasPrefix(name, envAllowedPrefix)) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}
