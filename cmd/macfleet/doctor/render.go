package doctor

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Write prints the report as plain aligned text, one section per heading, ready to
// paste into a bug report. The last line says PASS or FAIL.
func (r Report) Write(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	p := func(format string, args ...any) { fmt.Fprintf(tw, format, args...) }

	p("macfleet doctor\t%s\t%s\t%s/%s\tgauge %s\n", orDash(r.Version), r.Time.UTC().Format(time.RFC3339), r.OS, r.Arch, r.Gauge)
	r.writeMachine(p)
	r.writeCeiling(p)
	r.writeMemory(p)
	r.writeRunner(p)
	r.writeServer(p)
	r.writeSelfTest(p)

	p("\n")
	if r.Failed() {
		p("FAIL\t%s\n", strings.Join(r.problems(), "; "))
	} else {
		p("PASS\n")
	}
	return tw.Flush()
}

// printf prints one formatted piece of the report into its aligned table.
type printf func(format string, args ...any)

// writeMachine prints the machine section: the hardware as read.
func (r Report) writeMachine(p printf) {
	p("\n== machine\n")
	if r.HardwareError != "" {
		p("hardware\tFAILED\t%s\n", r.HardwareError)
	}
	hw := r.Hardware
	p("chip\t%s\n", orDash(hw.Chip))
	p("cpu cores\t%s\n", countOrDash(hw.CPUCores))
	p("gpu cores\t%s\n", countOrDash(hw.GPUCores))
	p("memory\t%s\n", formatSize(hw.UnifiedMemoryBytes))
	p("metal working set\t%s\n", sizeOrDash(hw.MetalWorkingSetBytes))
	p("wired limit\t%s\n", sizeOrDash(hw.WiredLimitBytes))
	for _, a := range hw.Accelerators {
		p("accelerator\t%s\t%s of its own\n", a.Name, formatSize(a.MemoryBytes))
	}
}

// writeCeiling prints the ceiling section: each bound and the one that wins.
func (r Report) writeCeiling(p printf) {
	p("\n== ceiling (what the agent would enforce)\n")
	p("bound\tbytes\t\tnote\n")
	for _, b := range r.Bounds {
		wins := ""
		if b.Wins {
			wins = "<- wins"
		}
		p("%s\t%s\t%s\t%s\n", b.Name, sizeOrDash(b.Bytes), wins, b.Note)
	}
}

// writeMemory prints the memory section: the agent's gauge beside the OS's tools.
func (r Report) writeMemory(p printf) {
	p("\n== memory (agent gauge beside the OS's own tools)\n")
	p("what\tagent\tos\tos source\tcheck\tnote\n")
	for _, row := range r.Memory {
		p("%s\t%s\t%s\t%s\t%s\t%s\n", row.What, row.Agent, row.OS, row.OSSource, row.Check, row.Note)
	}
}

// writeRunner prints the runner section: its binary, sandbox and backend.
func (r Report) writeRunner(p printf) {
	p("\n== runner\n")
	rr := r.Runner
	if rr.Path == "" {
		p("binary\tFAILED\t%s\n", rr.Note)
		return
	}
	p("binary\t%s\t(%s)\n", rr.Path, rr.Origin)
	p("sandbox\t%s\t%s\n", rr.Sandbox, rr.SandboxNote)
	if rr.Check == "" {
		p("backend\t-\tknown after the self-test loads a model\n")
		return
	}
	p("backend\t%s\t%s\t%s\n", orDash(rr.Backend), rr.Check, rr.Note)
	p("gpu allocated\t%s\n", formatSize(rr.MetalAllocatedBytes))
	if len(rr.Accelerators) > 0 {
		p("runner devices\t%s\t%s of its own\n", strings.Join(rr.Accelerators, ", "), formatSize(rr.DeviceBytes))
	}
	if rr.Backends != "" {
		p("backends\t%s\n", rr.Backends)
	}
	p("engine\t%s\n", orDash(rr.Engine))
}

// writeServer prints the server section, when its checks ran.
func (r Report) writeServer(p printf) {
	if len(r.Server) == 0 {
		return
	}
	p("\n== server (what other machines need of this Mac)\n")
	p("check\tverdict\tresult\n")
	for _, c := range r.Server {
		p("%s\t%s\t%s\n", c.Name, c.Check, c.Result)
		if c.Fix != "" {
			p("\t\tfix: %s\n", c.Fix)
		}
	}
}

// writeSelfTest prints the self-test section, when it ran: each step and the total.
func (r Report) writeSelfTest(p printf) {
	st := r.SelfTest
	if st == nil {
		return
	}
	p("\n== self-test (load, generate, unload a synthesized model through the engine pool)\n")
	p("step\ttook\tcheck\tresult\n")
	for _, s := range st.Steps {
		p("%s\t%s\t%s\t%s\n", s.Name, s.Took.Round(time.Millisecond), s.Check, s.Result)
	}
	verdict := "passed"
	if !st.Passed {
		verdict = "FAILED"
	}
	p("total\t%s\t%s\t\n", st.Duration.Round(time.Millisecond), verdict)
}

// problems names what made the report fail.
func (r Report) problems() []string {
	var out []string
	if r.HardwareError != "" {
		out = append(out, "the hardware could not be read")
	}
	for _, row := range r.Memory {
		if row.Check.failing() {
			out = append(out, fmt.Sprintf("%s %s", row.What, row.Check))
		}
	}
	if r.Runner.Check.failing() {
		if r.Runner.Path == "" {
			out = append(out, "no runner: build it with `make runner`")
		} else {
			out = append(out, "runner backend "+string(r.Runner.Check))
		}
	}
	for _, c := range r.Server {
		if c.Check.failing() {
			out = append(out, fmt.Sprintf("%s %s", c.Name, c.Check))
		}
	}
	if r.SelfTest != nil && !r.SelfTest.Passed {
		out = append(out, "self-test FAILED")
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func countOrDash(n int) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func sizeOrDash(b int64) string {
	if b <= 0 {
		return "-"
	}
	return formatSize(b)
}
