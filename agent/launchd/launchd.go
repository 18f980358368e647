// Package launchd installs the node agent, or `macfleet serve`, as a launchd service
// on macOS: Render builds the property list (run `macfleet agent <flags>` or `macfleet
// serve <flags>` at load, keep it alive, log to ~/Library/Logs/macfleet, keep models
// under ~/Library/Application Support/macfleet) and Install writes it to
// ~/Library/LaunchAgents (or /Library/LaunchDaemons) and loads it with launchctl,
// replacing a loaded older one.
package launchd

import (
	"bytes"
	"cmp"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"maps"
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

// ServeLabel is the launchd label of the `macfleet serve` service.
const ServeLabel = "dev.macfleet.serve"

// Service is what a launchd job runs: the node agent (Agent) or the standalone server
// (Serve).
type Service struct {
	// Label is the job's launchd label.
	Label string
	// Command is the macfleet subcommand; its name is also the log files'.
	Command string
	// Dirs are the directory flags defaulted under the data directory when the
	// command's flags do not set them, and created by Install.
	Dirs []DirFlag
	// PathFlags are the command's flags whose values are files or directories.
	PathFlags []string
	// NeedsKubeconfig: the command cannot run without KubeconfigFlag.
	NeedsKubeconfig bool
}

// DirFlag is a directory flag with its default below the data directory.
type DirFlag struct {
	Flag, Sub string
	// Why says what a directory macOS empties would cost.
	Why string
}

// Agent is the node agent's service.
var Agent = Service{Label: Label, Command: "agent", NeedsKubeconfig: true, PathFlags: PathFlags,
	Dirs: []DirFlag{{StoreFlag, "models", "models would be downloaded again after every restart"},
		{StateFlag, "state", "the agent could not adopt its runners after a restart"}}}

// Serve is the standalone server's service (`macfleet serve install`).
var Serve = Service{Label: ServeLabel, Command: "serve",
	PathFlags: []string{"--runner", StoreFlag, PromptCacheFlag, "--config", "--api-key-file", "--source-policy"},
	Dirs: []DirFlag{{StoreFlag, "models", "models would be downloaded again after every restart"},
		{PromptCacheFlag, "prompt-cache", "conversations' prompt states would be lost at every restart"}}}

// PromptCacheFlag names the directory of the prompt cache's SSD tier.
const PromptCacheFlag = "--prompt-cache-dir"

// Agent flags Render reads or adds.
const (
	// StoreFlag names the agent's model store; Render adds it with the default store
	// under Application Support when the agent flags do not set it (a LaunchDaemon
	// runs as root, whose home is not where the store belongs).
	StoreFlag = "--store-dir"
	// StateFlag names the agent's state directory; defaulted beside the store.
	StateFlag = "--state-dir"
	// KubeconfigFlag names the node's kubeconfig; launchd passes no KUBECONFIG, so
	// the service needs it.
	KubeconfigFlag = "--kubeconfig"
)

// Options describe the service to install.
type Options struct {
	// Service is what it runs; the zero value is Agent.
	Service Service
	// Executable is the absolute path of the macfleet binary launchd runs.
	Executable string
	// AgentArgs are the flags of the service's command (everything after `--`).
	AgentArgs []string
	// System installs a LaunchDaemon for the whole machine, which launchd starts at
	// boot without anyone logging in, instead of a LaunchAgent of the user.
	System bool
	// User is the account a LaunchDaemon runs as (its UserName); "" or "root" runs
	// it as root. Ignored for a LaunchAgent, which runs as the user who loads it.
	User string
	// Root stands in for / in a LaunchDaemon's paths (tests install under a
	// temporary directory); "" is /.
	Root string
	// Home is the user's home directory; required unless System.
	Home string
	// UID is the user's id, naming the gui/<uid> domain of a LaunchAgent.
	UID int
	// Dir, when set, is the directory relative paths in AgentArgs are relative to
	// (the installing shell's): the values of PathFlags are made absolute against it,
	// since launchd starts the agent elsewhere.
	Dir string
	// Kubeconfig is added as KubeconfigFlag when AgentArgs lack it (the installing
	// shell's $KUBECONFIG). Without either Render fails.
	Kubeconfig string
	// Env are KEY=VALUE environment variables of the agent (and the runners it
	// starts), for example the OTEL_* settings of tracing; launchd passes no shell's.
	// They go to an env file only the service's user can read (Plan.EnvFile), never
	// into the property list, which every user can read.
	Env []string
}

// PathFlags are the agent flags whose values are files or directories.
var PathFlags = []string{KubeconfigFlag, "--fleet-token-file", "--runner", StoreFlag, StateFlag}

// Plan is a rendered service: what Install writes and loads.
type Plan struct {
	Label string
	// PlistPath is where the property list goes.
	PlistPath string
	// LogDir holds StdoutPath and StderrPath.
	LogDir     string
	StdoutPath string
	StderrPath string
	// DataDir is the agent's data directory under Application Support and its
	// working directory.
	DataDir string
	// StoreDir and StateDir are the model store and state directory the agent is
	// given (StateDir: the agent's only).
	StoreDir string
	StateDir string
	// Dirs are the directories of Service.Dirs the command is given, in order.
	Dirs []string
	// Domain is the launchctl domain: gui/<uid> or system.
	Domain string
	// User is the account a LaunchDaemon runs as ("" for root or a LaunchAgent).
	User string
	// Owner, when set, is who the directories Install creates belong to: the User
	// of a LaunchDaemon, which writes them without root's rights. The caller looks
	// the account up (Render is pure).
	Owner *Owner
	// ProgramArguments is the command launchd runs.
	ProgramArguments []string
	// Plist is the property list's content.
	Plist []byte
	// EnvFile, when Options.Env is set, is the file (mode 0600, in DataDir) that holds
	// Env, the variables' KEY=VALUE lines; the command is given EnvFileFlag to read it.
	EnvFile string
	Env     []byte
}

// Owner is a numeric user and group.
type Owner struct{ UID, GID int }

// Locate is where the property list of svc goes and the launchctl domain it is
// loaded into: /Library/LaunchDaemons and "system" (under root, "" for /) when
// system, else the LaunchAgents of the user whose home and uid are given.
func Locate(svc Service, system bool, root, home string, uid int) (plistPath, domain string, err error) {
	if system {
		if root == "" {
			root = "/"
		}
		return filepath.Join(root, "Library", "LaunchDaemons", svc.Label+".plist"), "system", nil
	}
	if home == "" || !filepath.IsAbs(home) {
		return "", "", fmt.Errorf("a user service needs the absolute home directory, got %q", home)
	}
	return filepath.Join(home, "Library", "LaunchAgents", svc.Label+".plist"), "gui/" + strconv.Itoa(uid), nil
}

// Render builds the service for o. The model store and state directory are the ones
// given in the agent flags, else defaults under Application Support; either under a
// temporary directory is refused (macOS empties them). Relative paths are made
// absolute against o.Dir.
func Render(o Options) (*Plan, error) {
	svc := o.Service
	if svc.Label == "" {
		svc = Agent
	}
	if !filepath.IsAbs(o.Executable) {
		return nil, fmt.Errorf("the macfleet executable must be an absolute path, got %q", o.Executable)
	}
	p := &Plan{Label: svc.Label}
	var err error
	if p.PlistPath, p.Domain, err = Locate(svc, o.System, o.Root, o.Home, o.UID); err != nil {
		return nil, err
	}
	base := o.Home
	if o.System {
		base = cmp.Or(o.Root, "/")
		if o.User != "root" {
			p.User = o.User
		}
	}
	p.LogDir = filepath.Join(base, "Library", "Logs", "macfleet")
	p.StdoutPath = filepath.Join(p.LogDir, svc.Command+".log")
	p.StderrPath = filepath.Join(p.LogDir, svc.Command+".err.log")

	p.DataDir = filepath.Join(base, "Library", "Application Support", "macfleet")

	args := slices.Clone(o.AgentArgs)
	for _, flag := range svc.PathFlags {
		// Before anything is appended: a trailing flag would take it as its value.
		if _, _, err := flagValue(args, flag); err != nil {
			return nil, err
		}
	}
	if svc.NeedsKubeconfig {
		if _, found, _ := flagValue(args, KubeconfigFlag); !found && o.Kubeconfig != "" {
			args = append(args, KubeconfigFlag+"="+o.Kubeconfig)
		}
	}
	if o.Dir != "" {
		absolutize(args, o.Dir, svc.PathFlags)
	}
	if err := checkServiceArgs(svc, args); err != nil {
		return nil, err
	}
	for _, d := range svc.Dirs {
		dir, found, err := flagValue(args, d.Flag)
		if err != nil {
			return nil, err
		}
		if !found {
			dir = filepath.Join(p.DataDir, d.Sub)
			args = append(args, d.Flag+"="+dir)
		}
		if !filepath.IsAbs(dir) {
			return nil, fmt.Errorf("%s must be an absolute path for a launchd service, got %q", d.Flag, dir)
		}
		// A default under the home or the system's root is where it belongs (a test's
		// home may be temporary); a directory given is checked.
		if found && temporary(dir) {
			return nil, fmt.Errorf("%s %s is in a temporary directory that macOS empties: %s", d.Flag, dir, d.Why)
		}
		dir = filepath.Clean(dir)
		p.Dirs = append(p.Dirs, dir)
		switch d.Flag {
		case StoreFlag:
			p.StoreDir = dir
		case StateFlag:
			p.StateDir = dir
		}
	}
	if err := p.setCommand(o.Executable, svc.Command, o.Env, args); err != nil {
		return nil, err
	}
	if p.Plist, err = encodePlist(p); err != nil {
		return nil, err
	}
	return p, nil
}

// setCommand sets p's ProgramArguments: exe command args, with EnvFileFlag naming
// p.EnvFile (in the data directory) first when there is an environment env.
func (p *Plan) setCommand(exe, command string, env, args []string) error {
	p.ProgramArguments = []string{exe, command}
	if len(env) > 0 {
		var err error
		if p.Env, err = EncodeEnv(env); err != nil {
			return err
		}
		p.EnvFile = filepath.Join(p.DataDir, command+".env")
		p.ProgramArguments = append(p.ProgramArguments, EnvFileFlag+"="+p.EnvFile)
	}
	p.ProgramArguments = append(p.ProgramArguments, args...)
	return nil
}

// encodePlist is the property list of the service p describes. It holds no
// environment: every user of the Mac can read it (Plan.EnvFile holds that).
func encodePlist(p *Plan) ([]byte, error) {
	d := dict{
		{"Label", p.Label},
		{"ProgramArguments", p.ProgramArguments},
		{"RunAtLoad", true},
		{"KeepAlive", true},
		// launchd waits this long before restarting an agent that exited.
		{"ThrottleInterval", 10},
		{"ProcessType", "Interactive"},
		{"WorkingDirectory", p.DataDir},
		{"StandardOutPath", p.StdoutPath},
		{"StandardErrorPath", p.StderrPath},
	}
	if p.User != "" {
		d = append(d, entry{"UserName", p.User})
	}
	var buf bytes.Buffer
	buf.WriteString(xml.Header)
	buf.WriteString(`<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">` + "\n")
	buf.WriteString(`<plist version="1.0">` + "\n")
	if err := writeValue(&buf, d, 0); err != nil {
		return nil, err
	}
	buf.WriteString("</plist>\n")
	return buf.Bytes(), nil
}

// checkServiceArgs refuses what the service could not run with under launchd: the
// agent without an absolute kubeconfig (launchd passes no KUBECONFIG); serve with a
// relative model file (launchd starts it in the data directory) or with --api-key,
// whose value the world-readable property list would show (--api-key-file instead).
func checkServiceArgs(svc Service, args []string) error {
	if svc.NeedsKubeconfig {
		kubeconfig, found, err := flagValue(args, KubeconfigFlag)
		if err != nil {
			return err
		}
		if !found || !filepath.IsAbs(kubeconfig) {
			return fmt.Errorf("the agent needs %s with an absolute path (launchd passes no KUBECONFIG): "+
				"macfleet agent install -- %s /path/to/node.kubeconfig", KubeconfigFlag, KubeconfigFlag)
		}
	}
	if svc.Command != Serve.Command {
		return nil
	}
	if _, found, _ := flagValue(args, "--api-key"); found {
		return errors.New("--api-key would be written into the property list, which every user of the Mac can read: " +
			"put the key in a file only you can read and pass --api-key-file FILE")
	}
	for i := range args {
		v, ok, _ := flagAt(args, i, "--model")
		if !ok {
			continue
		}
		_, path, _ := strings.Cut(v, "=")
		if !strings.Contains(path, "://") && !filepath.IsAbs(path) {
			return fmt.Errorf("--model %s: a launchd service starts in its data directory, so the model file needs an absolute path", v)
		}
	}
	return nil
}

// envDict is the dictionary of KEY=VALUE pairs, sorted by key;
// the last value of a key wins, as in a shell.
func envDict(kvs []string) (dict, error) {
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t\n") {
			return nil, fmt.Errorf("environment variable %q: want KEY=VALUE, e.g. --env OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318", kv)
		}
		m[k] = v
	}
	var d dict
	for _, k := range slices.Sorted(maps.Keys(m)) {
		d = append(d, entry{k, m[k]})
	}
	return d, nil
}

// flagValue finds flag in args ("--flag VALUE" or "--flag=VALUE", one or two
// dashes); the last one wins, as with the flag parser.
func flagValue(args []string, flag string) (value string, found bool, err error) {
	for i := range args {
		v, ok, hasValue := flagAt(args, i, flag)
		if !ok {
			continue
		}
		if !hasValue {
			return "", false, fmt.Errorf("%s needs a value", flag)
		}
		value, found = v, true
	}
	return value, found, nil
}

// flagAt says whether args[i] is flag and returns its value, taken from the next
// argument when not given with '='; hasValue is false when there is none.
func flagAt(args []string, i int, flag string) (value string, ok, hasValue bool) {
	if slices.Contains(args[:i], "--") || !strings.HasPrefix(args[i], "-") {
		return "", false, false
	}
	name, value, inline := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
	if name != strings.TrimLeft(flag, "-") {
		return "", false, false
	}
	if inline {
		return value, true, true
	}
	if i+1 >= len(args) {
		return "", true, false
	}
	return args[i+1], true, true
}

// absolutize makes the relative values of flags in args absolute against dir, in
// place.
func absolutize(args []string, dir string, flags []string) {
	for i := range args {
		for _, flag := range flags {
			v, ok, hasValue := flagAt(args, i, flag)
			if !ok || !hasValue || v == "" || filepath.IsAbs(v) {
				continue
			}
			abs := filepath.Join(dir, v)
			if strings.Contains(args[i], "=") {
				name, _, _ := strings.Cut(args[i], "=")
				args[i] = name + "=" + abs
			} else {
				args[i+1] = abs
			}
		}
	}
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

// Install creates the log, data, store and state directories (owned by p.Owner when
// set), writes the env file (mode 0600) when there is one, the property list (mode 0644) and loads it into the plan's domain,
// booting out a loaded service of the same label first. Call CheckPlatform before.
func Install(ctx context.Context, p *Plan, launchctl Launchctl) error {
	if err := os.MkdirAll(filepath.Dir(p.PlistPath), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(p.PlistPath), err)
	}
	for _, dir := range append([]string{p.LogDir, p.DataDir}, p.Dirs...) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", dir, err)
		}
		// A LaunchDaemon's user writes its own directories (not their parents).
		if p.Owner != nil {
			if err := os.Chown(dir, p.Owner.UID, p.Owner.GID); err != nil {
				return fmt.Errorf("giving %s to %s: %w", dir, p.User, err)
			}
		}
	}
	if err := writeEnvFile(p); err != nil {
		return err
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
