// Package launchd installs the node agent as a launchd service on macOS: Render builds
// the property list (run `macfleet agent <flags>` at load, keep it alive, log to
// ~/Library/Logs/macfleet, keep models under ~/Library/Application Support/macfleet)
// and Install writes it to ~/Library/LaunchAgents (or /Library/LaunchDaemons) and
// loads it with launchctl, replacing a loaded older one.
package launchd

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Label is the launchd label of the agent service.
const Label = "dev.macfleet.agent"

// StoreFlag is the agent flag naming its model store directory. Render adds it with
// the default store when the agent flags do not set it.
const StoreFlag = "--model-store"

// Options describe the service to install.
type Options struct {
	// Executable is the absolute path of the macfleet binary launchd runs.
	Executable string
	// AgentArgs are the flags of `macfleet agent` (everything after `--`).
	AgentArgs []string
	// System installs a LaunchDaemon for the whole machine (root) instead of a
	// LaunchAgent of the user.
	System bool
	// Home is the user's home directory; required unless System.
	Home string
	// UID is the user's id, naming the gui/<uid> domain of a LaunchAgent.
	UID int
}

// Plan is a rendered service: what Install writes and loads.
type Plan struct {
	Label string
	// PlistPath is where the property list goes.
	PlistPath string
	// LogDir holds StdoutPath and StderrPath.
	LogDir     string
	StdoutPath string
	StderrPath string
	// StoreDir is the model store the agent is given.
	StoreDir string
	// Domain is the launchctl domain: gui/<uid> or system.
	Domain string
	// ProgramArguments is the command launchd runs.
	ProgramArguments []string
	// Plist is the property list's content.
	Plist []byte
}

// Render builds the service for o. The model store is the one given with StoreFlag
// in the agent flags, else the default under Application Support; a store under /tmp
// is refused (macOS empties it).
func Render(o Options) (*Plan, error) {
	if !filepath.IsAbs(o.Executable) {
		return nil, fmt.Errorf("the macfleet executable must be an absolute path, got %q", o.Executable)
	}
	p := &Plan{Label: Label}
	var base string
	switch {
	case o.System:
		base = "/"
		p.PlistPath = filepath.Join("/Library/LaunchDaemons", Label+".plist")
		p.Domain = "system"
	case o.Home == "" || !filepath.IsAbs(o.Home):
		return nil, fmt.Errorf("a user service needs the absolute home directory, got %q", o.Home)
	default:
		base = o.Home
		p.PlistPath = filepath.Join(o.Home, "Library", "LaunchAgents", Label+".plist")
		p.Domain = "gui/" + strconv.Itoa(o.UID)
	}
	p.LogDir = filepath.Join(base, "Library", "Logs", "macfleet")
	p.StdoutPath = filepath.Join(p.LogDir, "agent.log")
	p.StderrPath = filepath.Join(p.LogDir, "agent.err.log")

	args := slices.Clone(o.AgentArgs)
	store, found, err := storeArg(args)
	if err != nil {
		return nil, err
	}
	if !found {
		store = filepath.Join(base, "Library", "Application Support", "macfleet", "models")
		args = append(args, StoreFlag+"="+store)
	}
	if !filepath.IsAbs(store) {
		return nil, fmt.Errorf("%s must be an absolute path for a launchd service, got %q", StoreFlag, store)
	}
	if temporary(store) {
		return nil, fmt.Errorf("%s %s is in a temporary directory that macOS empties: models would be downloaded again after every restart", StoreFlag, store)
	}
	p.StoreDir = filepath.Clean(store)
	p.ProgramArguments = append([]string{o.Executable, "agent"}, args...)

	d := dict{
		{"Label", p.Label},
		{"ProgramArguments", p.ProgramArguments},
		{"RunAtLoad", true},
		{"KeepAlive", true},
		// launchd waits this long before restarting an agent that exited.
		{"ThrottleInterval", 10},
		{"ProcessType", "Interactive"},
		{"WorkingDirectory", filepath.Dir(p.StoreDir)},
		{"StandardOutPath", p.StdoutPath},
		{"StandardErrorPath", p.StderrPath},
	}
	var buf bytes.Buffer
	buf.WriteString(xml.Header)
	buf.WriteString(`<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">` + "\n")
	buf.WriteString(`<plist version="1.0">` + "\n")
	if err := writeValue(&buf, d, 0); err != nil {
		return nil, err
	}
	buf.WriteString("</plist>\n")
	p.Plist = buf.Bytes()
	return p, nil
}

// storeArg finds StoreFlag in args ("--model-store DIR" or "--model-store=DIR", one
// or two dashes).
func storeArg(args []string) (dir string, found bool, err error) {
	name := strings.TrimLeft(StoreFlag, "-")
	for i, a := range args {
		if a == "--" {
			break
		}
		if !strings.HasPrefix(a, "-") {
			continue
		}
		flag, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if flag != name {
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return "", false, fmt.Errorf("%s needs a directory", StoreFlag)
			}
			value = args[i+1]
		}
		dir, found = value, true
	}
	return dir, found, nil
}

// temporary says whether dir is under a directory macOS clears.
func temporary(dir string) bool {
	dir = filepath.Clean(dir)
	for _, t := range []string{"/tmp", "/private/tmp", "/private/var/tmp", "/var/folders", "/private/var/folders"} {
		if dir == t || strings.HasPrefix(dir, t+"/") {
			return true
		}
	}
	return false
}

// dict is a property list dictionary with its keys in order.
type dict []entry

type entry struct {
	key   string
	value any
}

// writeValue writes v (string, bool, int, []string or dict) as plist XML.
func writeValue(buf *bytes.Buffer, v any, depth int) error {
	indent := strings.Repeat("\t", depth)
	switch v := v.(type) {
	case string:
		buf.WriteString(indent + "<string>")
		if err := xml.EscapeText(buf, []byte(v)); err != nil {
			return err
		}
		buf.WriteString("</string>\n")
	case bool:
		if v {
			buf.WriteString(indent + "<true/>\n")
		} else {
			buf.WriteString(indent + "<false/>\n")
		}
	case int:
		fmt.Fprintf(buf, "%s<integer>%d</integer>\n", indent, v)
	case []string:
		buf.WriteString(indent + "<array>\n")
		for _, s := range v {
			if err := writeValue(buf, s, depth+1); err != nil {
				return err
			}
		}
		buf.WriteString(indent + "</array>\n")
	case dict:
		buf.WriteString(indent + "<dict>\n")
		for _, e := range v {
			buf.WriteString(indent + "\t<key>")
			if err := xml.EscapeText(buf, []byte(e.key)); err != nil {
				return err
			}
			buf.WriteString("</key>\n")
			if err := writeValue(buf, e.value, depth+1); err != nil {
				return err
			}
		}
		buf.WriteString(indent + "</dict>\n")
	default:
		return fmt.Errorf("plist: cannot encode %T", v)
	}
	return nil
}

// ErrNotDarwin is returned by CheckPlatform off macOS.
var ErrNotDarwin = errors.New("launchd exists only on macOS")

// CheckPlatform refuses to load a service anywhere but on macOS (goos "darwin").
func CheckPlatform(goos string) error {
	if goos != "darwin" {
		return fmt.Errorf("%w; this is %s: use --dry-run to print the property list", ErrNotDarwin, goos)
	}
	return nil
}

// Launchctl runs launchctl with args and returns its combined output.
type Launchctl func(ctx context.Context, args ...string) ([]byte, error)

// ExecLaunchctl runs /bin/launchctl.
func ExecLaunchctl(ctx context.Context, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, "/bin/launchctl", args...).CombinedOutput()
}

// bootstrapAttempts bounds the retries of bootstrap right after a bootout: launchd
// tears the old service down asynchronously and refuses the new one until it is gone.
const bootstrapAttempts = 10

// bootstrapRetry is the pause between bootstrap attempts (a variable for tests).
var bootstrapRetry = 500 * time.Millisecond

// Install creates the log and store directories, writes the property list (mode
// 0644) and loads it into the plan's domain, booting out a loaded service of the same
// label first. Call CheckPlatform before.
func Install(ctx context.Context, p *Plan, launchctl Launchctl) error {
	for _, dir := range []string{p.LogDir, p.StoreDir, filepath.Dir(p.PlistPath)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	tmp := p.PlistPath + ".tmp"
	if err := os.WriteFile(tmp, p.Plist, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, p.PlistPath); err != nil {
		return fmt.Errorf("installing %s: %w", p.PlistPath, err)
	}
	target := p.Domain + "/" + p.Label
	if _, err := launchctl(ctx, "print", target); err == nil {
		if out, err := launchctl(ctx, "bootout", target); err != nil {
			return fmt.Errorf("unloading the running %s: launchctl bootout: %w: %s", target, err, strings.TrimSpace(string(out)))
		}
	}
	var lastErr error
	for attempt := range bootstrapAttempts {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(bootstrapRetry):
			}
		}
		out, err := launchctl(ctx, "bootstrap", p.Domain, p.PlistPath)
		if err == nil {
			return nil
		}
		lastErr = fmt.Errorf("loading %s: launchctl bootstrap %s %s: %w: %s", target, p.Domain, p.PlistPath, err, strings.TrimSpace(string(out)))
	}
	return lastErr
}
