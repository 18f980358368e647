package doctor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/metal/enginepool"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

func TestCompare(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		name      string
		agent, os figure
		tolerance int64
		want      Check
		wantNote  string
	}{
		{name: "exact equal", agent: figure{bytes: 16 * gib}, os: figure{bytes: 16 * gib}, tolerance: exact, want: CheckOK},
		{name: "exact off by a page", agent: figure{bytes: 16 * gib}, os: figure{bytes: 16*gib - 16384}, tolerance: exact,
			want: CheckMismatch, wantNote: "differs by +16.0 KiB (16384)"},
		{name: "within tolerance", agent: figure{bytes: 5 * gib}, os: figure{bytes: 5*gib + 100*mib}, tolerance: 256 * mib,
			want: CheckOK, wantNote: "differs by -100.0 MiB (-104857600), within 256.0 MiB (268435456); why"},
		{name: "beyond tolerance", agent: figure{bytes: 9 * gib}, os: figure{bytes: 5 * gib}, tolerance: 256 * mib,
			want: CheckMismatch, wantNote: "differs by +4.0 GiB (4294967296), more than 256.0 MiB (268435456); why"},
		{name: "shown only", agent: figure{bytes: 1}, os: figure{bytes: 2}, tolerance: noCheck, want: CheckInfo, wantNote: "why"},
		{name: "agent failed", agent: figure{err: boom}, os: figure{bytes: 2}, tolerance: exact, want: CheckFailed, wantNote: "boom"},
		{name: "agent and os failed", agent: figure{err: boom}, os: figure{err: errors.New("no tool")}, tolerance: exact,
			want: CheckFailed, wantNote: "boom"},
		{name: "os tool failed", agent: figure{bytes: 1}, os: figure{err: errors.New("no tool")}, tolerance: exact,
			want: CheckUnavailable, wantNote: "no tool"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			note := "why"
			if tt.tolerance == exact {
				note = ""
			}
			r := compare("x", tt.agent, tt.os, "src", tt.tolerance, note)
			if r.Check != tt.want || r.Note != tt.wantNote {
				t.Errorf("compare = %s %q, want %s %q", r.Check, r.Note, tt.want, tt.wantNote)
			}
		})
	}
}

func TestBounds(t *testing.T) {
	tests := []struct {
		name              string
		hw                enginepool.Hardware
		configured        int64
		goos              string
		wantWinner        string
		wantMetalCapNote  string
		wantCeilingPrefix string
	}{{
		name: "linux: static", hw: enginepool.Hardware{TotalBytes: 16 * gib}, goos: "linux",
		wantWinner: "static", wantMetalCapNote: "absent: no Metal on linux", wantCeilingPrefix: "bound by the static ceiling",
	}, {
		name: "mac: working set below static", hw: enginepool.Hardware{TotalBytes: 16 * gib, MetalWorkingSetBytes: 10 * gib}, goos: "darwin",
		wantWinner: "metal cap", wantMetalCapNote: "the Metal recommended working set", wantCeilingPrefix: "bound by the Metal recommended working set",
	}, {
		name: "mac: wired limit wins over the working set", goos: "darwin",
		hw:         enginepool.Hardware{TotalBytes: 64 * gib, MetalWorkingSetBytes: 48 * gib, WiredLimitBytes: 40 * gib},
		wantWinner: "metal cap", wantMetalCapNote: "iogpu.wired_limit_mb", wantCeilingPrefix: "bound by the GPU wired limit",
	}, {
		name: "configured below everything", hw: enginepool.Hardware{TotalBytes: 64 * gib, MetalWorkingSetBytes: 48 * gib},
		configured: 12 * gib, goos: "darwin",
		wantWinner: "configured", wantMetalCapNote: "the Metal recommended working set", wantCeilingPrefix: "bound by the configured ceiling",
	}, {
		name: "mac without Metal figures", hw: enginepool.Hardware{TotalBytes: 8 * gib}, goos: "darwin",
		wantWinner: "static", wantMetalCapNote: "absent: neither", wantCeilingPrefix: "bound by the static ceiling",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := enginepool.ComputeCeiling(tt.hw, tt.configured, 0, 0, 0)
			bs := Bounds(c, false, tt.goos)
			var names, winners []string
			byName := map[string]Bound{}
			for _, b := range bs {
				names = append(names, b.Name)
				byName[b.Name] = b
				if b.Wins {
					winners = append(winners, b.Name)
				}
			}
			if d := cmp.Diff([]string{"static", "metal cap", "configured", "ceiling", "soft", "hard"}, names); d != "" {
				t.Errorf("bounds (-want +got):\n%s", d)
			}
			if d := cmp.Diff([]string{tt.wantWinner}, winners); d != "" {
				t.Errorf("winners (-want +got):\n%s", d)
			}
			if got := byName[tt.wantWinner].Bytes; got != c.Bytes {
				t.Errorf("the winner has %d bytes, the ceiling %d", got, c.Bytes)
			}
			if !strings.HasPrefix(byName["metal cap"].Note, tt.wantMetalCapNote) {
				t.Errorf("metal cap note %q, want it to start with %q", byName["metal cap"].Note, tt.wantMetalCapNote)
			}
			if !strings.HasPrefix(byName["ceiling"].Note, tt.wantCeilingPrefix) {
				t.Errorf("ceiling note %q, want it to start with %q", byName["ceiling"].Note, tt.wantCeilingPrefix)
			}
			if byName["soft"].Bytes != c.SoftBytes || byName["hard"].Bytes != c.HardBytes {
				t.Errorf("watermarks %d/%d, want %d/%d", byName["soft"].Bytes, byName["hard"].Bytes, c.SoftBytes, c.HardBytes)
			}
		})
	}
	if note := Bounds(enginepool.ComputeCeiling(enginepool.Hardware{TotalBytes: 16 * gib}, 0, 2*gib, 0, 0), true, "linux")[0].Note; !strings.Contains(note, "--memory-reserve") {
		t.Errorf("a configured reserve is not named: %q", note)
	}
}

func TestJudgeBackend(t *testing.T) {
	tests := []struct {
		offload, goos, goarch string
		wantBackend           string
		want                  Check
	}{
		{"gpu33", "darwin", "arm64", "Metal", CheckOK},
		{"cpu", "darwin", "arm64", "CPU", CheckMismatch},
		{"cpu", "linux", "amd64", "CPU", CheckOK},
		{"cpu", "darwin", "amd64", "CPU", CheckOK},
		{"gpu9", "linux", "amd64", "GPU", CheckInfo},
		{"", "linux", "amd64", "", CheckFailed},
		{"vulkan", "linux", "amd64", "vulkan", CheckFailed},
	}
	for _, tt := range tests {
		backend, c, note := judgeBackend(tt.offload, tt.goos, tt.goarch)
		if backend != tt.wantBackend || c != tt.want || note == "" {
			t.Errorf("judgeBackend(%q, %s/%s) = %q %s %q; want %q %s and a note", tt.offload, tt.goos, tt.goarch,
				backend, c, note, tt.wantBackend, tt.want)
		}
	}
	engine, offload := parseStateFormat("github.com/ollama/ollama@v0.17.4 h1:abc=;state=v2;kv=f16;seqs=1;offload=gpu5")
	if engine != "github.com/ollama/ollama@v0.17.4 h1:abc=" || offload != "gpu5" {
		t.Errorf("parseStateFormat = %q, %q", engine, offload)
	}
	if _, offload := parseStateFormat("unknown"); offload != "" {
		t.Errorf("parseStateFormat without offload = %q", offload)
	}
}

func TestRunnerOrigin(t *testing.T) {
	tests := []struct {
		configured, env, exe, path, want string
	}{
		{"bin/macfleet-runner", "/x/r", "/usr/local/bin/macfleet", "bin/macfleet-runner", "--runner"},
		{"", "/x/r", "/usr/local/bin/macfleet", "/x/r", "$MACFLEET_RUNNER"},
		{"", "", "/usr/local/bin/macfleet", "/usr/local/bin/macfleet-runner", "next to macfleet"},
		{"", "", "/home/me/macfleet", "/usr/bin/macfleet-runner", "$PATH"},
	}
	for _, tt := range tests {
		if got := runnerOrigin(tt.configured, tt.env, tt.exe, tt.path); got != tt.want {
			t.Errorf("runnerOrigin(%q, %q, %q, %q) = %q, want %q", tt.configured, tt.env, tt.exe, tt.path, got, tt.want)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for in, want := range map[int64]string{
		0: "0 B", 1023: "1023 B", -5: "-5 B", 1024: "1.0 KiB (1024)", 3 * mib / 2: "1.5 MiB (1572864)",
		16 * gib: "16.0 GiB (17179869184)", -2 * gib: "-2.0 GiB (-2147483648)", 3 << 40: "3.0 TiB (3298534883328)",
	} {
		if got := formatSize(in); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", in, got, want)
		}
	}
}

// fakeGauge is a enginepool.Gauge with fixed answers.
type fakeGauge struct {
	hw      enginepool.Hardware
	host    enginepool.HostMemory
	hostErr error
	procs   map[int]int64
}

func (g fakeGauge) Hardware() (enginepool.Hardware, error) { return g.hw, nil }
func (g fakeGauge) Host() (enginepool.HostMemory, error)   { return g.host, g.hostErr }
func (g fakeGauge) Process(pid int) (int64, error) {
	if v, ok := g.procs[pid]; ok {
		return v, nil
	}
	return 0, fmt.Errorf("pid %d: %w", pid, enginepool.ErrProcessNotFound)
}

// mac16 is a 16 GiB Mac whose gauge agrees with vmStatOutput (540000 pages used).
var mac16 = fakeGauge{
	hw: enginepool.Hardware{TotalBytes: 16 * gib, MetalWorkingSetBytes: 11453246122, Chip: "Apple M2", CPUCores: 8, GPUCores: 10},
	host: enginepool.HostMemory{TotalBytes: 16 * gib, UsedBytes: 540000*16384 + 3*mib,
		AvailableBytes: 16*gib - 540000*16384 - 3*mib},
	procs: map[int]int64{4242: 700 * mib},
}

func macTools() fakeTools {
	return fakeTools{commands: map[string]string{
		"sysctl -n hw.memsize":           "17179869184\n",
		"sysctl -n iogpu.wired_limit_mb": "0\n",
		"vm_stat":                        vmStatOutput,
		"memory_pressure":                memoryPressureOutput,
		"ps -o rss= -p 4242":             "  512000\n",
	}}
}

func checks(rows []Row) map[string]Check {
	m := map[string]Check{}
	for _, r := range rows {
		m[r.What] = r.Check
	}
	return m
}

func TestMemoryRowsDarwin(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		gauge fakeGauge
		tools func(fakeTools)
		want  map[string]Check
	}{{
		name: "agreeing", gauge: mac16, tools: func(fakeTools) {},
		want: map[string]Check{"memory total": CheckOK, "wired limit": CheckOK, "metal working set": CheckInfo,
			"memory used": CheckOK, "memory available": CheckOK, "memory free %": CheckInfo},
	}, {
		// A misread vm_statistics64 (a shifted member) gives a figure far from vm_stat's.
		name: "wrong layout", gauge: func() fakeGauge {
			g := mac16
			g.host.UsedBytes, g.host.AvailableBytes = 12*gib, 4*gib
			return g
		}(), tools: func(fakeTools) {},
		want: map[string]Check{"memory total": CheckOK, "wired limit": CheckOK, "metal working set": CheckInfo,
			"memory used": CheckMismatch, "memory available": CheckMismatch, "memory free %": CheckInfo},
	}, {
		name: "wired limit set but not read", gauge: mac16, tools: func(f fakeTools) { f.commands["sysctl -n iogpu.wired_limit_mb"] = "12288\n" },
		want: map[string]Check{"memory total": CheckOK, "wired limit": CheckMismatch, "metal working set": CheckInfo,
			"memory used": CheckOK, "memory available": CheckOK, "memory free %": CheckInfo},
	}, {
		name: "macOS 13: no iogpu sysctl, no memory_pressure", gauge: mac16, tools: func(f fakeTools) {
			delete(f.commands, "sysctl -n iogpu.wired_limit_mb")
			delete(f.commands, "memory_pressure")
		},
		want: map[string]Check{"memory total": CheckOK, "wired limit": CheckUnavailable, "metal working set": CheckInfo,
			"memory used": CheckOK, "memory available": CheckOK, "memory free %": CheckUnavailable},
	}, {
		name: "host gauge failed", gauge: func() fakeGauge { g := mac16; g.hostErr = errors.New("kern_return 5"); return g }(),
		tools: func(fakeTools) {},
		want: map[string]Check{"memory total": CheckOK, "wired limit": CheckOK, "metal working set": CheckInfo,
			"memory used": CheckFailed, "memory available": CheckFailed, "memory free %": CheckInfo},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tools := macTools()
			tt.tools(tools)
			host, hostErr := tt.gauge.Host()
			rows := memoryRows(ctx, "darwin", gaugeMemory{hw: tt.gauge.hw, host: host, hostErr: hostErr}, tools)
			if d := cmp.Diff(tt.want, checks(rows)); d != "" {
				t.Errorf("checks (-want +got):\n%s", d)
			}
		})
	}
	r := processRow(ctx, "darwin", mac16, macTools(), 4242)
	if r.Check != CheckInfo || r.AgentBytes != 700*mib || r.OSBytes != 512000<<10 {
		t.Errorf("processRow = %+v", r)
	}
	if r := processRow(ctx, "darwin", mac16, macTools(), 7); r.Check != CheckFailed {
		t.Errorf("processRow of a gone pid = %+v", r)
	}
}

func TestMemoryRowsLinux(t *testing.T) {
	const total, avail = 16384000 << 10, 12000000 << 10
	pcpZone := "  pagesets\n    cpu: 0\n              count: 2000\n"
	tests := []struct {
		name     string
		used     int64
		zoneinfo bool
		want     Check
	}{
		{name: "equal", used: total - avail, zoneinfo: true, want: CheckOK},
		{name: "per-CPU lists counted as available", used: total - avail - 300*mib, zoneinfo: true, want: CheckOK},
		{name: "far off", used: total - avail + 3*gib, zoneinfo: true, want: CheckMismatch},
		{name: "no zoneinfo", used: total - avail - 100*mib, want: CheckOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tools := fakeTools{files: map[string]string{"/proc/meminfo": meminfoOutput}}
			if tt.zoneinfo {
				tools.files["/proc/zoneinfo"] = pcpZone
			}
			gm := gaugeMemory{hw: enginepool.Hardware{TotalBytes: total},
				host: enginepool.HostMemory{TotalBytes: total, UsedBytes: tt.used, AvailableBytes: total - tt.used}}
			got := checks(linuxRows(gm, tools))
			want := map[string]Check{"memory total": CheckOK, "memory used": tt.want, "memory available": tt.want}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("checks (-want +got):\n%s", d)
			}
		})
	}
	rows := linuxRows(gaugeMemory{hw: enginepool.Hardware{TotalBytes: total}}, fakeTools{})
	if got := checks(rows); got["memory total"] != CheckUnavailable {
		t.Errorf("without /proc/meminfo: %v", got)
	}
	status := fakeTools{files: map[string]string{"/proc/77/status": "VmRSS:\t  40960 kB\n"}}
	g := fakeGauge{procs: map[int]int64{77: 41 * mib}}
	if r := processRow(context.Background(), "linux", g, status, 77); r.Check != CheckOK || r.OSSource != "/proc/77/status VmRSS" {
		t.Errorf("processRow = %+v", r)
	}
}

// TestRunReport runs doctor against a fake Mac without the self-test and checks the
// whole printed report: sections, the ceiling's winner, every memory row, and a PASS.
func TestRunReport(t *testing.T) {
	rep, err := Run(context.Background(), Options{Gauge: mac16, Tools: macTools(), GOOS: "darwin", GOARCH: "arm64",
		SkipSelfTest: true, RunnerPath: "/bin/sh"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed() {
		t.Fatalf("the report failed: %v", rep.problems())
	}
	if rep.Ceiling.Bound != enginepool.BoundMetalWorkingSet || rep.Hardware.Chip != "Apple M2" || rep.Runner.Origin != "--runner" {
		t.Errorf("ceiling bound %s, chip %q, runner origin %q", rep.Ceiling.Bound, rep.Hardware.Chip, rep.Runner.Origin)
	}
	var out bytes.Buffer
	if err := rep.Write(&out); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{
		"darwin/arm64", "== machine", "chip               Apple M2", "== ceiling",
		"metal cap   10.7 GiB (11453246122)  <- wins  the Metal recommended working set",
		"memory used", "vm_stat anonymous - purgeable + wired + compressor", "memory free %", "62%",
		"known after the self-test loads a model", "\nsandbox ", "\nPASS\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the report lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "== self-test") {
		t.Errorf("a skipped self-test is printed:\n%s", text)
	}

	bad := mac16
	bad.host.UsedBytes = 14 * gib
	rep, err = Run(context.Background(), Options{Gauge: bad, Tools: macTools(), GOOS: "darwin", GOARCH: "arm64",
		SkipSelfTest: true, RunnerPath: "/nonexistent/macfleet-runner"})
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	_ = rep.Write(&out)
	if !rep.Failed() || !strings.Contains(out.String(), "FAIL  memory used MISMATCH; no runner: build it with `make runner`") {
		t.Errorf("a wrong gauge and a missing runner do not fail the report:\n%s", out.String())
	}

	// Without a runner the self-test fails at once, naming `make runner`.
	rep, err = Run(context.Background(), Options{Gauge: mac16, Tools: macTools(), GOOS: "darwin", GOARCH: "arm64",
		RunnerPath: "/nonexistent/macfleet-runner"})
	if err != nil {
		t.Fatal(err)
	}
	if st := rep.SelfTest; st == nil || st.Passed || len(st.Steps) != 1 || !strings.Contains(st.Steps[0].Result, "make runner") {
		t.Errorf("self-test without a runner: %+v", rep.SelfTest)
	}
	if _, err := Run(context.Background(), Options{CeilingBytes: -1}); err == nil {
		t.Error("a negative ceiling is accepted")
	}
}

// TestUnloadVerdict: a settled unload passes; one that timed out fails unless the
// host's used memory rose by more than the runner held, which only something else
// allocating explains.
func TestUnloadVerdict(t *testing.T) {
	report := func(o enginepool.SettleOutcome) *enginepool.UnloadReport {
		return &enginepool.UnloadReport{Outcome: o, ResidentBytes: 48 * mib}
	}
	for _, tc := range []struct {
		name          string
		outcome       enginepool.SettleOutcome
		before, after int64
		hostOK        bool
		want          Check
	}{
		{"settled", enginepool.Settled, 1 * gib, 1*gib - 48*mib, true, CheckOK},
		{"settled although the host rose", enginepool.Settled, 1 * gib, 1*gib + 100*mib, true, CheckOK},
		{"leak: the gauge stays where it was", enginepool.TimedOut, 1 * gib, 1 * gib, true, CheckFailed},
		{"leak plus noise within the footprint", enginepool.TimedOut, 1 * gib, 1*gib + 48*mib, true, CheckFailed},
		{"another process allocated more than the runner held", enginepool.TimedOut, 1 * gib, 1*gib + 300*mib, true, CheckInconclusive},
		{"no host gauge", enginepool.TimedOut, 0, 0, false, CheckFailed},
		{"no host gauge, even with a rise", enginepool.TimedOut, 1 * gib, 2 * gib, false, CheckFailed},
		{"indeterminate", enginepool.Indeterminate, 1 * gib, 2 * gib, true, CheckFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := unloadVerdict(report(tc.outcome), tc.before, tc.after, tc.hostOK)
			if got != tc.want {
				t.Errorf("verdict %s (%q), want %s", got, why, tc.want)
			}
			if got.failing() != (tc.want == CheckFailed) {
				t.Errorf("%s failing() = %v", got, got.failing())
			}
			if (why != "") != (got == CheckInconclusive) || (got == CheckInconclusive && !strings.Contains(why, "run doctor again on an idle machine")) {
				t.Errorf("note %q for %s", why, got)
			}
		})
	}
}
