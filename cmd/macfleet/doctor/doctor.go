// Package doctor reports, on any machine, what the node agent would measure and decide
// there: the hardware, the memory ceiling and which bound wins it, every memory gauge
// beside the figures of the operating system's own tools, the runner's backend, and a
// self-test that loads, generates with and unloads a synthesized model through the
// engine pool. `macfleet doctor` prints the report; on a first Mac its output says at
// once whether the numbers are right, and goes into a bug report as it is.
//
// Nothing here measures memory a second way: the figures are the agent's own
// (enginepool.Gauge, enginepool.ComputeCeiling, enginepool.Pool). What this package adds is the
// operating system's side of each comparison (ostools.go) and the verdicts, which
// are pure functions of the two.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/agent/hardware"
	"github.com/macfleet/macfleet/internal/devicegauge"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
)

// DefaultSelfTestTimeout bounds the self-test when Options.SelfTestTimeout is zero.
// On an idle machine it takes about a second; the unload's settle barrier alone may
// wait 5 s for memory that does not come back.
const DefaultSelfTestTimeout = 60 * time.Second

// Options are the agent flags that change what it decides, and the seams.
type Options struct {
	// RunnerPath is the runner binary (the agent's --runner); empty finds it as the
	// agent does: $MACFLEET_RUNNER, else next to the macfleet binary, else on $PATH.
	RunnerPath string
	// CeilingBytes and ReserveBytes are the agent's --memory-ceiling and
	// --memory-reserve; zero for none and the default.
	CeilingBytes, ReserveBytes int64
	// SkipSelfTest leaves out the load/generate/unload of a synthesized model.
	SkipSelfTest bool
	// SelfTestTimeout bounds the self-test; zero means DefaultSelfTestTimeout.
	SelfTestTimeout time.Duration
	// Gauge measures memory; nil means enginepool.NewGauge().
	Gauge enginepool.Gauge
	// Tools reads the OS's own figures; nil means SystemTools.
	Tools Tools
	// DeviceGauge reads the cards with memory of their own; nil means
	// devicegauge.Detect's (none on a Mac).
	DeviceGauge devicegauge.Gauge
	// GOOS and GOARCH say which OS tools to ask and which backend to expect; empty
	// means runtime.GOOS and runtime.GOARCH.
	GOOS, GOARCH string
	// Log receives the engine pool's log; the zero logger discards it.
	Log logr.Logger
	// Version is the macfleet version, printed in the report's first line.
	Version string

	// Kubeconfig is the node's credential (the agent's --kubeconfig): the API server
	// it names is dialled. Empty skips the check.
	Kubeconfig string
	// AgentListen is the agent's --listen address, checked free or the agent's;
	// empty skips the check. AdvertiseAddress is what the cluster dials, shown.
	AgentListen, AdvertiseAddress string
	// Executable is the macfleet binary the firewall must let in.
	Executable string
	// NetTimeout bounds each network check; zero means DefaultNetTimeout.
	NetTimeout time.Duration
	// SkipServer leaves out the checks of the Mac as a server.
	SkipServer bool
}

// Check is the verdict on one figure or step.
type Check string

const (
	// CheckOK: the agent's figure agrees with the OS's, or the step worked.
	CheckOK Check = "ok"
	// CheckMismatch: the agent's figure disagrees with the OS's beyond the tolerance.
	CheckMismatch Check = "MISMATCH"
	// CheckFailed: the agent could not measure the figure, or the step failed.
	CheckFailed Check = "FAILED"
	// CheckInfo: shown for the reader, with nothing to compare it with.
	CheckInfo Check = "info"
	// CheckUnavailable: the OS tool could not be read, so nothing was compared.
	CheckUnavailable Check = "n/a"
	// CheckWarn: works here, but not as a server others reach (a Mac that sleeps, a
	// firewall in the way); the report does not fail for it.
	CheckWarn Check = "WARN"
	// CheckSkipped: not checked on this operating system or without its input.
	CheckSkipped Check = "skipped"
	// CheckInconclusive: the figure could not be attributed to what was measured
	// (something else on the machine moved the host gauge more than the step could);
	// the report does not fail for it and says to run again on an idle machine.
	CheckInconclusive Check = "inconclusive"
)

// failing says whether the check makes the report fail.
func (c Check) failing() bool { return c == CheckMismatch || c == CheckFailed }

// Report is everything doctor measured and decided.
type Report struct {
	Time     time.Time     `json:"time"`
	Version  string        `json:"version,omitempty"`
	OS       string        `json:"os"`
	Arch     string        `json:"arch"`
	Gauge    string        `json:"gauge"`
	Hardware hardware.Info `json:"hardware"`
	// HardwareError is why the gauge could not read the hardware.
	HardwareError string `json:"hardwareError,omitempty"`
	// Ceiling is what the agent would enforce; Bounds explain it.
	Ceiling enginepool.Ceiling `json:"ceiling"`
	Bounds  []Bound            `json:"bounds"`
	// Memory sets each gauge's figure beside the OS's own.
	Memory []Row `json:"memory"`
	// Runner is the runner binary and the backend it reported in the self-test.
	Runner RunnerReport `json:"runner"`
	// Server are the checks of the Mac as a server others reach.
	Server []ServerCheck `json:"server,omitempty"`
	// SelfTest is absent when it was skipped.
	SelfTest *SelfTest `json:"selfTest,omitempty"`
}

// Bound is one of the bounds whose minimum is the ceiling.
type Bound struct {
	Name string `json:"name"`
	// Bytes is zero when the bound is absent.
	Bytes int64  `json:"bytes"`
	Wins  bool   `json:"wins,omitempty"`
	Note  string `json:"note"`
}

// Row is one figure as the agent measures it beside the OS tool's.
type Row struct {
	What string `json:"what"`
	// Agent is the agent's figure as shown; AgentBytes its value when it is a size.
	Agent      string `json:"agent"`
	AgentBytes int64  `json:"agentBytes,omitempty"`
	// OS is the OS tool's figure as shown, OSSource the tool and field.
	OS       string `json:"os"`
	OSBytes  int64  `json:"osBytes,omitempty"`
	OSSource string `json:"osSource"`
	Check    Check  `json:"check"`
	Note     string `json:"note,omitempty"`
}

// Failed says whether anything in the report failed: a figure the agent could not
// measure or that disagrees with the OS, a missing runner, or a failed self-test.
func (r Report) Failed() bool {
	if r.HardwareError != "" || r.Runner.Check.failing() {
		return true
	}
	for _, row := range r.Memory {
		if row.Check.failing() {
			return true
		}
	}
	for _, c := range r.Server {
		if c.Check.failing() {
			return true
		}
	}
	return r.SelfTest != nil && !r.SelfTest.Passed
}

// Run measures this machine. It fails only on options it cannot use; everything the
// machine does wrong is in the report (see Report.Failed).
func Run(ctx context.Context, opts Options) (Report, error) {
	if opts.CeilingBytes < 0 || opts.ReserveBytes < 0 {
		return Report{}, errors.New("the memory ceiling and reserve must not be negative")
	}
	if opts.GOOS == "" {
		opts.GOOS, opts.GOARCH = runtime.GOOS, runtime.GOARCH
	}
	if opts.Tools == nil {
		opts.Tools = SystemTools{}
	}
	if opts.SelfTestTimeout <= 0 {
		opts.SelfTestTimeout = DefaultSelfTestTimeout
	}
	if opts.NetTimeout <= 0 {
		opts.NetTimeout = DefaultNetTimeout
	}
	rep := Report{Time: time.Now(), Version: opts.Version, OS: opts.GOOS, Arch: opts.GOARCH}
	g := opts.Gauge
	if g == nil {
		var err error
		if g, err = enginepool.NewGauge(); err != nil {
			rep.HardwareError = err.Error()
			return rep, nil
		}
	}
	rep.Gauge = fmt.Sprintf("%T", g)
	hw, err := g.Hardware()
	if err != nil {
		rep.HardwareError = err.Error()
	}
	rep.Hardware = hardware.Info{Chip: hw.Chip, CPUCores: hw.CPUCores, GPUCores: hw.GPUCores,
		UnifiedMemoryBytes: hw.TotalBytes, MetalWorkingSetBytes: hw.MetalWorkingSetBytes,
		WiredLimitBytes: hw.WiredLimitBytes, Arch: opts.GOARCH, OS: opts.GOOS}
	if opts.DeviceGauge == nil {
		opts.DeviceGauge = devicegauge.Detect()
	}
	if opts.DeviceGauge == nil {
		// No card with memory of its own.
	} else if info, err := hardware.WithAccelerators(ctx, rep.Hardware, opts.DeviceGauge); err != nil {
		rep.HardwareError = strings.TrimPrefix(rep.HardwareError+"; reading the accelerators: "+err.Error(), "; ")
	} else {
		rep.Hardware = info
	}
	rep.Ceiling = enginepool.ComputeCeiling(hw, opts.CeilingBytes, opts.ReserveBytes, 0, 0)
	rep.Bounds = Bounds(rep.Ceiling, opts.ReserveBytes > 0, opts.GOOS)

	host, hostErr := g.Host()
	gm := gaugeMemory{hw: hw, hwErr: err, host: host, hostErr: hostErr}
	rep.Memory = memoryRows(ctx, opts.GOOS, gm, opts.Tools)

	rep.Runner.Path, rep.Runner.Origin, err = locateRunner(opts.RunnerPath)
	sb := sandbox.Probe()
	rep.Runner.Sandbox, rep.Runner.SandboxNote = sb.Mechanism, sb.Detail
	if !sb.Enforced {
		rep.Runner.Sandbox = "none"
		rep.Runner.SandboxNote += ": the agent refuses to start runners unless it runs with " + sandbox.AllowUnconfinedFlag
	}
	if err != nil {
		rep.Runner.Check, rep.Runner.Note = CheckFailed, err.Error()+"; build it with `make runner` (bin/macfleet-runner) or set "+runnerproc.RunnerEnv
	}
	if !opts.SkipServer {
		rep.Server = serverChecks(ctx, opts)
	}
	if opts.SkipSelfTest {
		return rep, nil
	}
	st := &SelfTest{}
	rep.SelfTest = st
	if rep.Runner.Path == "" {
		st.fail("runner", 0, "no runner binary: build it with `make runner`")
		return rep, nil
	}
	stCtx, cancel := context.WithTimeout(ctx, opts.SelfTestTimeout)
	defer cancel()
	selfTest(stCtx, opts, g, &rep)
	return rep, nil
}

// locateRunner finds the runner as the agent does (runnerproc.RunnerExecutable) and says
// where it was found.
func locateRunner(configured string) (path, origin string, err error) {
	path, err = runnerproc.RunnerExecutable(configured)
	if err != nil {
		return "", "", err
	}
	exe, _ := os.Executable()
	return path, runnerOrigin(configured, os.Getenv(runnerproc.RunnerEnv), exe, path), nil
}

// runnerOrigin names where runnerproc.ResolveRunnerPath took path from.
func runnerOrigin(configured, env, exe, path string) string {
	switch {
	case configured != "":
		return "--runner"
	case env != "":
		return "$" + runnerproc.RunnerEnv
	case exe != "" && filepath.Dir(exe) == filepath.Dir(path):
		return "next to macfleet"
	}
	return "$PATH"
}

// Bounds explains the ceiling: each bound of min(static, Metal cap, configured), the
// one that wins, and the watermarks. reserveConfigured says the reserve came from
// --memory-reserve rather than the default.
func Bounds(c enginepool.Ceiling, reserveConfigured bool, goos string) []Bound {
	reserve := "the default reserve: 4 GiB below 24 GiB of memory, else 6 GiB"
	if reserveConfigured {
		reserve = "--memory-reserve"
	}
	static := Bound{Name: "static", Bytes: c.StaticBytes, Wins: c.Bound == enginepool.BoundStatic,
		Note: fmt.Sprintf("%s memory - %s reserve (%s)", formatSize(c.TotalBytes), formatSize(c.ReserveBytes), reserve)}
	metalCap := Bound{Name: "metal cap", Bytes: c.MetalCapBytes,
		Wins: c.Bound == enginepool.BoundWiredLimit || c.Bound == enginepool.BoundMetalWorkingSet}
	switch {
	case c.MetalCapBound == enginepool.BoundWiredLimit:
		metalCap.Note = "iogpu.wired_limit_mb, which overrides the Metal working set"
	case c.MetalCapBound == enginepool.BoundMetalWorkingSet:
		metalCap.Note = "the Metal recommended working set (iogpu.wired_limit_mb is the default)"
	case goos == "darwin":
		metalCap.Note = "absent: neither a wired limit nor a Metal working set was read"
	default:
		metalCap.Note = "absent: no Metal on " + goos
	}
	configured := Bound{Name: "configured", Bytes: c.ConfiguredBytes, Wins: c.Bound == enginepool.BoundConfigured,
		Note: "--memory-ceiling (or the MacNode's spec.memoryCeiling)"}
	if c.ConfiguredBytes == 0 {
		configured.Note = "none: " + configured.Note
	}
	return []Bound{static, metalCap, configured,
		{Name: "ceiling", Bytes: c.Bytes, Note: c.Describe() + "; to raise it, " + c.Fix()},
		{Name: "soft", Bytes: c.SoftBytes, Note: fmt.Sprintf("%.0f%% of the ceiling: loads wait and idle models are evicted above it", 100*enginepool.DefaultSoftFraction)},
		{Name: "hard", Bytes: c.HardBytes, Note: fmt.Sprintf("%.0f%% of the ceiling: in-flight requests are aborted above it", 100*enginepool.DefaultHardFraction)},
	}
}

// figure is one measured size, or why it could not be measured.
type figure struct {
	bytes int64
	err   error
}

// Tolerances of the comparisons: exact for fixed figures such as the memory size; for
// host usage, which two samples read at slightly different moments (and which the
// Linux gauge reads with the per-CPU free lists counted as available), the larger of
// 256 MiB and 5% of memory; for a process, the larger of 32 MiB and 10%.
const (
	exact   = 0
	noCheck = -1
)

func hostTolerance(total int64) int64 { return max(256<<20, total/20) }

func processTolerance(v int64) int64 { return max(32<<20, v/10) }

// compare sets the agent's figure beside the OS's: exact (tolerance 0), within a
// tolerance, or only shown (tolerance noCheck). An agent figure that failed fails the
// row; an OS figure that failed leaves it unchecked.
func compare(what string, agent, ref figure, osSource string, tolerance int64, note string) Row {
	r := Row{What: what, OSSource: osSource, Note: note}
	if agent.err != nil {
		r.Agent, r.Check, r.Note = "error", CheckFailed, agent.err.Error()
	} else {
		r.Agent, r.AgentBytes = formatSize(agent.bytes), agent.bytes
	}
	if ref.err != nil {
		r.OS = "error"
		if r.Check == "" {
			r.Check, r.Note = CheckUnavailable, ref.err.Error()
		}
		return r
	}
	r.OS, r.OSBytes = formatSize(ref.bytes), ref.bytes
	if r.Check != "" {
		return r
	}
	diff := agent.bytes - ref.bytes
	switch {
	case tolerance == noCheck:
		r.Check = CheckInfo
	case diff == 0:
		r.Check = CheckOK
	case tolerance == exact:
		r.Check = CheckMismatch
		r.Note = joinNote(fmt.Sprintf("differs by %s", formatSignedSize(diff)), note)
	case abs(diff) <= tolerance:
		r.Check = CheckOK
		r.Note = joinNote(fmt.Sprintf("differs by %s, within %s", formatSignedSize(diff), formatSize(tolerance)), note)
	default:
		r.Check = CheckMismatch
		r.Note = joinNote(fmt.Sprintf("differs by %s, more than %s", formatSignedSize(diff), formatSize(tolerance)), note)
	}
	return r
}

func joinNote(a, b string) string {
	if b == "" {
		return a
	}
	return a + "; " + b
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// formatSize shows a size in binary units with the exact byte count, so that a
// pasted report keeps every digit: "23.5 GiB (25276026880)".
func formatSize(b int64) string {
	const unit = 1024
	if b < unit && b > -unit {
		return fmt.Sprintf("%d B", b)
	}
	v, i := float64(b), -1
	for ; (v >= unit || v <= -unit) && i < 4; i++ {
		v /= unit
	}
	return fmt.Sprintf("%.1f %ciB (%d)", v, "KMGTP"[i], b)
}

func formatSignedSize(b int64) string {
	if b > 0 {
		return "+" + formatSize(b)
	}
	return formatSize(b)
}
