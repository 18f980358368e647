package doctor

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ServerCheck is one check of the Mac as a server other machines reach: it stays
// awake, its firewall lets the agent's port in, it reaches the cluster, its agent port
// is free or the agent's.
type ServerCheck struct {
	Name   string `json:"name"`
	Check  Check  `json:"check"`
	Result string `json:"result"`
	// Fix says what to run or change, when something should be.
	Fix string `json:"fix,omitempty"`
}

// The commands the macOS checks read.
const (
	pmsetPath = "/usr/bin/pmset"
	// SocketFilterFW is the application firewall's command line tool.
	SocketFilterFW = "/usr/libexec/ApplicationFirewall/socketfilterfw"
)

// serverChecks checks the Mac as a server: awake, its firewall, the cluster, the
// agent's port.
func serverChecks(ctx context.Context, opts Options) []ServerCheck {
	checks := macChecks(ctx, opts.GOOS, opts.Tools, opts.Executable)
	checks = append(checks, ClusterCheck(ctx, opts.Kubeconfig, opts.NetTimeout))
	if opts.AgentListen == "" {
		return append(checks, ServerCheck{Name: "agent port", Check: CheckSkipped, Result: "no --listen given"})
	}
	return append(checks, AgentPortCheck(ctx, opts.AgentListen, opts.AdvertiseAddress, opts.NetTimeout))
}

// skippedNotMac is the check name on another operating system.
func skippedNotMac(name string) ServerCheck {
	return ServerCheck{Name: name, Check: CheckSkipped, Result: "skipped (not macOS)"}
}

// macChecks reads the power and firewall settings of a Mac; off macOS it says they
// were skipped. exe is the binary whose incoming connections the firewall must allow.
func macChecks(ctx context.Context, goos string, tools Tools, exe string) []ServerCheck {
	if goos != "darwin" {
		return []ServerCheck{skippedNotMac("sleep"), skippedNotMac("restart after power loss"), skippedNotMac("firewall")}
	}
	pm, pmErr := tools.Output(ctx, pmsetPath, "-g")
	global, globalErr := tools.Output(ctx, SocketFilterFW, "--getglobalstate")
	stealth, _ := tools.Output(ctx, SocketFilterFW, "--getstealthmode")
	var (
		app    []byte
		appErr error
	)
	if exe != "" {
		app, appErr = tools.Output(ctx, SocketFilterFW, "--getappblocked", exe)
	}
	sleep, restart := PowerChecks(pm, pmErr)
	return []ServerCheck{sleep, restart, FirewallCheck(global, globalErr, stealth, FirewallApp{Path: exe, Answer: app, Err: appErr})}
}

// pmsetLine is a setting of `pmset -g`: a name (which may hold spaces: "Sleep On
// Power Button"), a number, and what follows it ("(sleep prevented by powerd)").
var pmsetLine = regexp.MustCompile(`^\s*(\S.*?)\s+(-?\d+)\s*(.*)$`)

// ParsePmset reads the settings in use from `pmset -g`: each name's number and the
// rest of its line.
func ParsePmset(out []byte) map[string]PmsetValue {
	settings := map[string]PmsetValue{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		m := pmsetLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		n, err := strconv.Atoi(m[2])
		if err != nil {
			continue
		}
		settings[m[1]] = PmsetValue{N: n, Note: strings.TrimSpace(m[3])}
	}
	return settings
}

// PmsetValue is one setting of `pmset -g`.
type PmsetValue struct {
	N    int
	Note string
}

// PowerChecks judges `pmset -g` (out, or the error running it): a Mac that sleeps when
// idle drops its agent off the network (its replicas are placed elsewhere, and a
// single-Mac `serve` stops answering); one that does not restart after a power failure
// stays off.
func PowerChecks(out []byte, err error) (sleep, restart ServerCheck) {
	sleep, restart = ServerCheck{Name: "sleep"}, ServerCheck{Name: "restart after power loss"}
	if err != nil {
		sleep.Check, sleep.Result = CheckUnavailable, "pmset -g: "+err.Error()
		restart.Check, restart.Result = CheckUnavailable, sleep.Result
		return sleep, restart
	}
	s := ParsePmset(out)
	var fix []string
	switch v, ok := s["sleep"]; {
	case !ok:
		sleep.Check, sleep.Result = CheckUnavailable, "pmset -g names no sleep setting"
	case v.N == 0:
		sleep.Check, sleep.Result = CheckOK, "never sleeps when idle (sleep 0)"
	default:
		sleep.Check = CheckWarn
		sleep.Result = fmt.Sprintf("sleeps after %d min idle: its agent and models go off the network", v.N)
		if v.Note != "" {
			sleep.Result += " " + v.Note
		}
		fix = append(fix, "sleep 0")
	}
	if d, ok := s["disksleep"]; ok && d.N != 0 {
		sleep.Result += fmt.Sprintf("; disks sleep after %d min idle (a model loaded then waits for them)", d.N)
		fix = append(fix, "disksleep 0")
	}
	if len(fix) > 0 {
		sleep.Fix = "sudo pmset -a " + strings.Join(fix, " ")
	}
	switch v, ok := s["autorestart"]; {
	case !ok:
		restart.Check, restart.Result = CheckInfo, "pmset -g names no autorestart setting (not on this model)"
	case v.N == 0:
		restart.Check, restart.Result, restart.Fix = CheckWarn, "stays off after a power failure (autorestart 0)", "sudo pmset -a autorestart 1"
	default:
		restart.Check, restart.Result = CheckOK, "starts again after a power failure (autorestart 1)"
	}
	return sleep, restart
}

// FirewallApp is the macfleet binary and socketfilterfw's answer to --getappblocked
// for it (or the error asking).
type FirewallApp struct {
	Path   string
	Answer []byte
	Err    error
}

// FirewallCheck judges the application firewall from socketfilterfw's answers to
// --getglobalstate (global, or the error running it), --getstealthmode and
// --getappblocked app.Path: with the firewall on, the binary must be allowed incoming
// connections, or the gateway and the manager cannot reach the agent.
func FirewallCheck(global []byte, globalErr error, stealth []byte, app FirewallApp) ServerCheck {
	exe := app.Path
	c := ServerCheck{Name: "firewall"}
	g := strings.ToLower(string(global))
	allow := fmt.Sprintf("sudo %s --add %s && sudo %s --unblockapp %s", SocketFilterFW, exe, SocketFilterFW, exe)
	switch {
	case globalErr != nil:
		c.Check, c.Result = CheckUnavailable, "socketfilterfw --getglobalstate: "+globalErr.Error()
		return c
	case strings.Contains(g, "state = 0") || strings.Contains(g, "disabled"):
		c.Check, c.Result = CheckOK, "off: nothing blocks incoming connections"
		return c
	case strings.Contains(g, "state = 2") || strings.Contains(g, "blocking all") || strings.Contains(g, "block all"):
		c.Check, c.Result = CheckWarn, "blocks all incoming connections: nothing reaches the agent"
		c.Fix = "System Settings > Network > Firewall > Options: turn off \"Block all incoming connections\", then " + allow
		return c
	case !strings.Contains(g, "enabled") && !strings.Contains(g, "state = 1"):
		c.Check, c.Result = CheckUnavailable, "socketfilterfw said: "+strings.TrimSpace(string(global))
		return c
	}
	a := strings.ToLower(string(app.Answer))
	switch {
	case exe == "":
		c.Check, c.Result, c.Fix = CheckWarn, "on; which binary it lets in is unknown", "allow macfleet: "+allow
	case app.Err != nil:
		c.Check, c.Result, c.Fix = CheckWarn, "on; whether it lets "+exe+" in could not be read: "+app.Err.Error(), allow
	case strings.Contains(a, "block"):
		c.Check, c.Result, c.Fix = CheckWarn, "on, and it blocks "+exe+": nothing reaches the agent", allow
	case strings.Contains(a, "permit") || strings.Contains(a, "allow"):
		c.Check, c.Result = CheckOK, "on; "+exe+" may accept incoming connections"
	default:
		c.Check = CheckWarn
		c.Result = "on; " + exe + " is not in its list: macOS asks on the first connection, which a headless Mac cannot answer"
		c.Fix = allow
	}
	if s := strings.ToLower(string(stealth)); strings.Contains(s, "enabled") || strings.Contains(s, " on") {
		c.Result += "; stealth mode on (no answer to ping: test the agent's port instead)"
	}
	return c
}
