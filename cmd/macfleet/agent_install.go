package main

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/macfleet/macfleet/agent/launchd"
)

// newAgentInstallCmd is `macfleet agent install`; the agent command adds it.
func newAgentInstallCmd() *cobra.Command {
	return newInstallCmd(launchd.Agent, &cobra.Command{
		Use:   "install [--system] [--dry-run] -- AGENT-FLAGS...",
		Short: "Install the node agent as a launchd service on this Mac",
		Long: `Write a launchd property list that runs "macfleet agent" with the flags given after
--, keeps it alive (restarted if it exits, started at login or boot) and logs to
~/Library/Logs/macfleet/agent.log and agent.err.log, then load it with
"launchctl bootstrap", replacing a loaded older one. Models are stored under
~/Library/Application Support/macfleet/models unless --store-dir is given.

The service is a LaunchAgent of the current user (~/Library/LaunchAgents), which
starts at login, or with --system a LaunchDaemon of the machine
(/Library/LaunchDaemons, logs in /Library/Logs/macfleet, models in /Library/Application
Support/macfleet; needs sudo), which starts at boot without anyone logging in: a
headless Mac that reboots rejoins by itself. The LaunchDaemon runs as the account
--user names (default: who ran sudo), which owns its directories and must be able to
read and rewrite the kubeconfig. Relative paths in the agent flags are made
absolute; --kubeconfig defaults to $KUBECONFIG, as launchd does not pass it on.
--dry-run prints the property list instead, on any operating system.`,
		Example: "  macfleet agent install -- --kubeconfig ~/macfleet/mac-1.kubeconfig --node-name mac-1\n" +
			"  macfleet agent install --dry-run -- --kubeconfig mac-1.kubeconfig --memory-ceiling 24Gi\n" +
			"  macfleet agent install --env OTEL_EXPORTER_OTLP_ENDPOINT=http://otel.example:4318 -- --kubeconfig mac-1.kubeconfig\n" +
			"  sudo macfleet agent install --system -- --kubeconfig /Users/admin/macfleet/mac-1.kubeconfig\n" +
			"  tail -f ~/Library/Logs/macfleet/agent.err.log",
	})
}

// installOptions are the flags of an install command.
type installOptions struct {
	system, dryRun   bool
	executable, user string
	env              []string
}

// newInstallCmd completes cmd (its Use, Short, Long and Example set) into the install
// command of svc: the command's flags after --, rendered into a launchd service
// (launchd.Render) and installed, or printed with --dry-run.
func newInstallCmd(svc launchd.Service, cmd *cobra.Command) *cobra.Command {
	var o installOptions
	cmd.RunE = func(cmd *cobra.Command, args []string) error { return installService(cmd, svc, args, &o) }
	o.addFlags(cmd.Flags())
	return cmd
}

// addFlags binds the install command's flags to o.
func (o *installOptions) addFlags(f *pflag.FlagSet) {
	f.BoolVar(&o.system, "system", false, "Install a LaunchDaemon for the whole machine (/Library/LaunchDaemons; needs sudo) instead of a LaunchAgent of your user")
	f.BoolVar(&o.dryRun, "dry-run", false, "Print the property list and where it would go; change nothing")
	f.StringVar(&o.executable, "executable", "", "The macfleet binary launchd runs (default: this one)")
	f.StringVar(&o.user, "user", "", "With --system, the account the service runs as (default $SUDO_USER: who ran sudo; root only if named)")
	f.StringArrayVar(&o.env, "env", nil, "KEY=VALUE environment variable of the service and its runners (repeatable), e.g. OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 to trace requests; "+
		"written to a file only you can read (mode 0600, in the data directory) that the service loads with --env-file, never into the property list")
}

// installService renders svc running args (the flags after --) into a launchd
// service and prints it (--dry-run) or installs and loads it.
func installService(cmd *cobra.Command, svc launchd.Service, args []string, o *installOptions) error {
	if len(args) > 0 && cmd.ArgsLenAtDash() != 0 {
		return fmt.Errorf("unexpected argument %q: the %s flags go after --, e.g. macfleet %s install -- %s", args[0],
			svc.Command, svc.Command, map[bool]string{true: "--kubeconfig node.kubeconfig", false: "--model NAME=SOURCE"}[svc.NeedsKubeconfig])
	}
	if o.user != "" && !o.system {
		return fmt.Errorf("--user names the account of a LaunchDaemon: add --system (a LaunchAgent runs as you)")
	}
	if !o.dryRun {
		if err := launchd.CheckPlatform(serviceOS); err != nil {
			return err
		}
	}
	exe, err := installExecutable(o.executable)
	if err != nil {
		return err
	}
	plan, err := o.render(svc, exe, args)
	if err != nil {
		return err
	}
	tmpExe := inTempDir(exe)
	if o.dryRun {
		if _, err := cmd.OutOrStdout().Write(plan.Plist); err != nil {
			return err
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "Dry run: would write %s and load it into %s (logs in %s, models in %s)\n",
			plan.PlistPath, plan.Domain, plan.LogDir, plan.StoreDir)
		if plan.EnvFile != "" {
			fmt.Fprintf(cmd.ErrOrStderr(), "The --env variables would go to %s (mode 0600), not into the property list\n", plan.EnvFile)
		}
		if tmpExe {
			fmt.Fprintf(cmd.ErrOrStderr(), "Warning: %s is in a temporary directory; install macfleet (and macfleet-runner beside it) somewhere permanent first\n", exe)
		}
		return nil
	}
	if tmpExe {
		return fmt.Errorf("%s is in a temporary directory (go run?): install macfleet and macfleet-runner somewhere permanent, e.g. /usr/local/bin, or pass --executable", exe)
	}
	return o.install(cmd, svc, plan)
}

// render is the launchd service of svc that runs exe with args, for this user (or
// with --system the daemon's) in the current directory.
func (o *installOptions) render(svc launchd.Service, exe string, args []string) (*launchd.Plan, error) {
	lo := launchd.Options{Service: svc, Executable: exe, AgentArgs: args, System: o.system, UID: os.Getuid(),
		Kubeconfig: firstPath(os.Getenv("KUBECONFIG")), Env: o.env, Root: serviceSystemRoot}
	var err error
	if o.system {
		if lo.User, err = daemonUser(o.user); err != nil {
			return nil, err
		}
	}
	if lo.Dir, err = os.Getwd(); err != nil {
		return nil, fmt.Errorf("the current directory: %w", err)
	}
	if !o.system {
		if lo.Home, err = os.UserHomeDir(); err != nil {
			return nil, fmt.Errorf("a LaunchAgent lives in the home directory: %w", err)
		}
	}
	return launchd.Render(lo)
}

// install writes and loads plan, the service of svc, and prints where it went.
func (o *installOptions) install(cmd *cobra.Command, svc launchd.Service, plan *launchd.Plan) error {
	if err := checkRoot(o.system, serviceEUID()); err != nil {
		return err
	}
	if plan.User != "" {
		var err error
		if plan.Owner, err = lookupOwner(plan.User); err != nil {
			return err
		}
		if kc := kubeconfigOf(plan); kc != "" {
			if w := ownerWarning(kc, plan.User, plan.Owner.UID); w != "" {
				fmt.Fprintln(cmd.ErrOrStderr(), "Warning: "+w)
			}
		}
	}
	if err := launchd.Install(cmd.Context(), plan, serviceLaunchctl); err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "Installed %s and loaded it into %s\n", plan.PlistPath, plan.Domain)
	fmt.Fprintf(out, "Command: %s\n", strings.Join(plan.ProgramArguments, " "))
	fmt.Fprintf(out, "Logs:    %s, %s\n", plan.StdoutPath, plan.StderrPath)
	fmt.Fprintf(out, "Models:  %s\n", plan.StoreDir)
	if plan.EnvFile != "" {
		fmt.Fprintf(out, "Env:     %s (mode 0600: the --env variables)\n", plan.EnvFile)
	}
	if plan.User != "" {
		fmt.Fprintf(out, "User:    %s (starts at boot, without a login)\n", plan.User)
	}
	fmt.Fprintf(out, "Remove:  %smacfleet %s uninstall%s\n", map[bool]string{true: "sudo "}[o.system], svc.Command,
		map[bool]string{true: " --system"}[o.system])
	return nil
}

// daemonUser is the account a LaunchDaemon runs as: flag, else who ran sudo. Root
// must be named: the agent and its runners need no root rights.
func daemonUser(flag string) (string, error) {
	name := cmp.Or(flag, os.Getenv("SUDO_USER"))
	if name == "" {
		return "", fmt.Errorf("--system: name the account the service runs as with --user NAME " +
			"(it owns the models and logs; --user root if it must be root)")
	}
	return name, nil
}

// lookupOwner is the uid and primary gid of the account name.
func lookupOwner(name string) (*launchd.Owner, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("--user %s: %w", name, err)
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("--user %s: %w", name, err)
	}
	return &launchd.Owner{UID: uid, GID: gid}, nil
}

// kubeconfigOf is the agent's --kubeconfig in plan, "" for none.
func kubeconfigOf(plan *launchd.Plan) string {
	in := launchd.Installed{Service: launchd.Agent, Args: plan.ProgramArguments[min(2, len(plan.ProgramArguments)):]}
	kc, _ := in.Flag(launchd.KubeconfigFlag)
	return kc
}

// ownerWarning says what keeps the user of uid from reading the kubeconfig at path and
// rewriting it with each renewed token (a new file renamed over it in its directory),
// or "" when both belong to that user.
func ownerWarning(path, user string, uid int) string {
	for _, p := range []string{path, filepath.Dir(path)} {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Sprintf("%s: %v", p, err)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != uid {
			return fmt.Sprintf("%s belongs to uid %d, but the service runs as %s, who must read the kubeconfig and "+
				"rewrite it with each renewed token: sudo chown %s %s %s", p, st.Uid, user, user, filepath.Dir(path), path)
		}
	}
	return ""
}

// checkRoot refuses to write a LaunchDaemon without root, or a LaunchAgent as root.
func checkRoot(system bool, euid int) error {
	switch {
	case system && euid != 0:
		return fmt.Errorf("--system: a LaunchDaemon lives in /Library/LaunchDaemons: run it with sudo")
	case !system && euid == 0:
		return fmt.Errorf("running as root: use --system for a LaunchDaemon, or run without sudo for a LaunchAgent of your user")
	}
	return nil
}

// installExecutable is the path of the binary a service runs: the absolute,
// symlink-free path of flag (default: this binary), or for a binary of a Homebrew keg
// the same file through the formula's opt link (homebrewOpt), which outlives the keg.
func installExecutable(flag string) (string, error) {
	exe, err := resolveExecutable(flag)
	if err != nil {
		return "", err
	}
	if opt := homebrewOpt(exe); opt != "" {
		return opt, nil
	}
	return exe, nil
}

// homebrewOpt is, for a file of a Homebrew keg (<prefix>/Cellar/<formula>/<version>/
// <rest>), the same file through the formula's opt link (<prefix>/opt/<formula>/<rest>),
// which every upgrade moves to the new keg while it removes the old one: a property
// list that named the keg would run a binary that is gone. "" when path is in no keg,
// or the opt link does not lead to this very file.
func homebrewOpt(path string) string {
	i := strings.LastIndex(path, "/Cellar/")
	if i < 0 {
		return ""
	}
	parts := strings.SplitN(path[i+len("/Cellar/"):], "/", 3) // formula, version, the rest
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return ""
	}
	opt := filepath.Join(path[:i], "opt", parts[0], parts[2])
	if resolved, err := filepath.EvalSymlinks(opt); err != nil || resolved != path {
		return ""
	}
	return opt
}

// resolveExecutable is the absolute, symlink-free path of flag, default this binary:
// the file the firewall and code signing know.
func resolveExecutable(flag string) (string, error) {
	exe := flag
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return "", fmt.Errorf("finding the macfleet binary (pass --executable): %w", err)
		}
	}
	abs, err := filepath.Abs(exe)
	if err != nil {
		return "", fmt.Errorf("the macfleet binary %s: %w", exe, err)
	}
	if resolved, err := filepath.EvalSymlinks(abs); err == nil {
		abs = resolved
	} else if flag == "" {
		return "", fmt.Errorf("the macfleet binary %s: %w", abs, err)
	}
	return abs, nil
}

// inTempDir says whether path is under the temporary directory (where go run builds).
func inTempDir(path string) bool {
	for _, dir := range []string{os.TempDir(), "/tmp", "/private/tmp", "/private/var/folders", "/var/folders"} {
		if dir = filepath.Clean(dir); strings.HasPrefix(path, dir+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

// firstPath is the first entry of a path list such as $KUBECONFIG.
func firstPath(list string) string {
	for _, p := range filepath.SplitList(list) {
		if p != "" {
			return p
		}
	}
	return ""
}
