package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/macfleet/macfleet/agent/launchd"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/credentials"
	"github.com/macfleet/macfleet/metal/enginepool/runnerproc"
)

// The seams of install and uninstall to the machine, replaced by tests: the
// operating system, launchctl, the effective user id, and the directory standing in
// for / in a LaunchDaemon's paths.
var (
	serviceOS         = runtime.GOOS
	serviceLaunchctl  = launchd.Launchctl(launchd.ExecLaunchctl)
	serviceEUID       = os.Geteuid
	serviceSystemRoot = ""
)

func newAgentUninstallCmd() *cobra.Command {
	return newUninstallCmd(launchd.Agent, &cobra.Command{
		Use:   "uninstall [--system] [--purge] [--keep-credential] [--dry-run]",
		Short: "Remove the node agent's launchd service, its credential and state from this Mac",
		Long: `Unload the agent's launchd service and remove what "macfleet agent install" and the
agent wrote, as its property list names it: the property list, the node credential
(the kubeconfig given as --kubeconfig, when it holds a token of "macfleet nodes
credentials"; the agent rewrote it with each renewed token), and the state directory
(the agent's TLS key pinned to this Mac, its runners' records). Runners the agent left
running for its next start are stopped. With --purge the model store and the logs go
too, except a directory the installed "macfleet serve" service uses.

The cluster keeps this Mac's MacNode, Lease and identity: the command prints what
to run on the admin machine to remove them.`,
		Example: "  macfleet agent uninstall --dry-run\n" +
			"  macfleet agent uninstall --purge\n" +
			"  sudo macfleet agent uninstall --system",
	})
}

func newServeUninstallCmd() *cobra.Command {
	return newUninstallCmd(launchd.Serve, &cobra.Command{
		Use:   "uninstall [--system] [--purge] [--dry-run]",
		Short: "Remove the launchd service of `macfleet serve` from this Mac",
		Long: `Unload the launchd service "macfleet serve install" wrote and remove its property
list. With --purge the model store, the prompt cache and the logs go too, except a
directory the installed node agent uses.`,
		Example: "  macfleet serve uninstall\n  sudo macfleet serve uninstall --system --purge",
	})
}

// newUninstallCmd completes cmd into the uninstall command of svc.
func newUninstallCmd(svc launchd.Service, cmd *cobra.Command) *cobra.Command {
	var (
		system, dryRun bool
		o              launchd.RemovalOptions
	)
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if !dryRun {
			if err := launchd.CheckPlatform(serviceOS); err != nil {
				return err
			}
		}
		home, _ := os.UserHomeDir()
		o.Home = home
		in, others, err := readInstalled(svc, system, home)
		if err != nil {
			return err
		}
		o.Others = others
		node := nodeOf(in)
		if kc, ok := in.Flag(launchd.KubeconfigFlag); ok {
			if name, ok := nodeCredential(kc); ok {
				o.NodeCredential, node = true, name
			}
		}
		removal := launchd.PlanRemoval(in, o)
		out := cmd.OutOrStdout()
		if dryRun {
			fmt.Fprintf(out, "Dry run: would unload %s/%s and\n", in.Domain, svc.Label)
			printItems(out, "Would remove", removal.Remove)
			printItems(out, "Would keep", removal.Keep)
			printClusterObjects(out, svc, node)
			return nil
		}
		if err := checkRoot(system, serviceEUID()); err != nil {
			return err
		}
		loaded, err := launchd.Unload(cmd.Context(), in, serviceLaunchctl)
		if err != nil {
			return err
		}
		if loaded {
			fmt.Fprintf(out, "Unloaded %s/%s\n", in.Domain, svc.Label)
		}
		if svc.NeedsKubeconfig {
			stopLeftRunners(cmd.Context(), in, out)
		}
		removed, err := launchd.Apply(removal)
		printItems(out, "Removed", removed)
		printItems(out, "Kept", removal.Keep)
		printClusterObjects(out, svc, node)
		return err
	}
	f := cmd.Flags()
	f.BoolVar(&system, "system", false, "Remove the LaunchDaemon (/Library/LaunchDaemons; needs sudo) instead of your user's LaunchAgent")
	f.BoolVar(&o.Purge, "purge", false, "Also remove the model store, the prompt cache and the logs")
	f.BoolVar(&dryRun, "dry-run", false, "Print what would be removed and kept; change nothing")
	if svc.NeedsKubeconfig {
		f.BoolVar(&o.KeepCredential, "keep-credential", false, "Keep the node credential and the agent's TLS key (to install the agent again as the same Mac)")
	}
	return cmd
}

// readInstalled reads the installed property list of svc and those of the other
// macfleet services in the same domain.
func readInstalled(svc launchd.Service, system bool, home string) (*launchd.Installed, []*launchd.Installed, error) {
	read := func(s launchd.Service) (*launchd.Installed, error) {
		path, domain, err := launchd.Locate(s, system, serviceSystemRoot, home, os.Getuid())
		if err != nil {
			return nil, err
		}
		return launchd.ReadInstalled(s, path, domain)
	}
	in, err := read(svc)
	if errors.Is(err, launchd.ErrNotInstalled) {
		hint := "; a LaunchDaemon is removed with sudo and --system"
		if system {
			hint = "; a LaunchAgent of a user is removed by that user, without --system"
		}
		return nil, nil, fmt.Errorf("macfleet %s is not installed here (%w)%s", svc.Command, err, hint)
	}
	if err != nil {
		return nil, nil, err
	}
	var others []*launchd.Installed
	for _, s := range []launchd.Service{launchd.Agent, launchd.Serve} {
		if s.Label == svc.Label {
			continue
		}
		if other, err := read(s); err == nil {
			others = append(others, other)
		}
	}
	return in, others, nil
}

// nodeCredential says whether the kubeconfig at path holds a node token that
// `macfleet nodes credentials` issued (bound, of the node identities' namespace), and
// whose.
func nodeCredential(path string) (string, bool) {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return "", false
	}
	ctx, ok := cfg.Contexts[cfg.CurrentContext]
	if !ok {
		return "", false
	}
	user, ok := cfg.AuthInfos[ctx.AuthInfo]
	if !ok || user.Token == "" {
		return "", false
	}
	c, err := credentials.ParseClaims(user.Token)
	if err != nil || c.Namespace != v1alpha1.NodeIdentityNamespace || c.Secret == "" || c.ServiceAccount == "" {
		return "", false
	}
	return c.ServiceAccount, true
}

// nodeOf is the MacNode the installed agent runs as: its --node-name, else the host's
// name as the agent defaults it.
func nodeOf(in *launchd.Installed) string {
	if name, ok := in.Flag("--node-name"); ok {
		return name
	}
	host, _ := os.Hostname()
	return strings.ToLower(strings.SplitN(host, ".", 2)[0])
}

// stopLeftRunners stops the runners the agent left running for its next start (they
// would otherwise hold their models' memory until their orphan timeout).
func stopLeftRunners(ctx context.Context, in *launchd.Installed, out io.Writer) {
	state, ok := in.Flag(launchd.StateFlag)
	if !ok {
		return
	}
	dir := filepath.Join(state, "runners")
	if _, err := os.Stat(dir); err != nil {
		return
	}
	f := runnerproc.NewProcessFactory(runnerproc.ProcessConfig{StateDir: dir, Log: logr.Discard()})
	n, err := f.StopUnclaimed(ctx)
	if n > 0 {
		fmt.Fprintf(out, "Stopped %d runner(s) the agent left running\n", n)
	}
	if err != nil {
		fmt.Fprintf(out, "Warning: stopping the runners the agent left: %v\n", err)
	}
}

func printItems(out io.Writer, verb string, items []launchd.Item) {
	for _, it := range items {
		line := fmt.Sprintf("%-12s %s (%s", verb, it.Path, it.What)
		if it.Why != "" {
			line += ": " + it.Why
		}
		fmt.Fprintln(out, line+")")
	}
}

// printClusterObjects tells what the agent's Mac left in the cluster, and how the
// administrator removes it.
func printClusterObjects(out io.Writer, svc launchd.Service, node string) {
	if !svc.NeedsKubeconfig || node == "" {
		return
	}
	fmt.Fprintf(out, `The cluster keeps this Mac's objects; on the admin machine:
  macfleet nodes revoke %[1]s                          # every token of %[1]s stops working, copies included
  kubectl delete macnode %[1]s                         # its replicas are placed on other Macs
  kubectl -n %[2]s delete lease %[1]s
  kubectl -n %[3]s delete serviceaccount %[1]s
`, node, v1alpha1.NodeLeaseNamespace, v1alpha1.NodeIdentityNamespace)
}
