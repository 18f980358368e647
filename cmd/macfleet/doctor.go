package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/macfleet/macfleet/agent/clustermode"
	"github.com/macfleet/macfleet/agent/config"
	"github.com/macfleet/macfleet/cmd/macfleet/doctor"
)

func init() { root.AddCommand(newDoctorCommand()) }

// errDoctorFailed makes doctor exit non-zero after it has printed its report.
var errDoctorFailed = fmt.Errorf("doctor found a problem: see the report above")

// doctorOptions are the flags of `macfleet doctor`: the report's options and the flags
// parsed into them.
type doctorOptions struct {
	opts             doctor.Options
	ceiling, reserve string
	asJSON           bool
	verbosity        int
}

func newDoctorCommand() *cobra.Command {
	var o doctorOptions
	cmd := &cobra.Command{
		Use:   "doctor [flags]",
		Short: "Print what the node agent would measure and decide on this machine, and run a self-test",
		Long: "Prints the chip and memory, the memory ceiling and which bound wins it, each memory gauge " +
			"of the agent beside the operating system's own figures (macOS: sysctl, vm_stat, memory_pressure, ps; " +
			"Linux: /proc), the runner binary and the backend it uses (Metal or CPU), and the result of a self-test " +
			"that loads a synthesized model through the engine pool, generates from it and unloads it, with the " +
			"bytes the unload freed. Run it first on a new Mac and paste its output into bug reports.\n\n" +
			"It then checks the Mac as a server others reach: whether it sleeps when idle and restarts after a power " +
			"failure (pmset), whether the application firewall lets macfleet accept connections (socketfilterfw), " +
			"whether the API server of the node's kubeconfig answers TLS with a certificate its CA vouches for, and " +
			"whether the agent's --listen port is free or held by the running agent. The first two are macOS's " +
			"and skipped elsewhere; sleep and the firewall only warn.\n\n" +
			"Exits 1 when a figure cannot be measured or disagrees with the OS, when the runner is missing, " +
			"when the cluster cannot be reached or the agent's port is taken, or when the self-test fails.",
		Example: "  macfleet doctor\n" +
			"  macfleet doctor --runner bin/macfleet-runner --memory-ceiling 12Gi\n" +
			"  macfleet doctor --kubeconfig ~/mac-1.kubeconfig --skip-self-test\n" +
			"  macfleet doctor --json > doctor.json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return printDoctorReport(cmd, &o) },
	}
	o.addFlags(cmd.Flags())
	return cmd
}

// addFlags binds the doctor's flags to o.
func (o *doctorOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.opts.RunnerPath, "runner", "", "the macfleet-runner binary (default $MACFLEET_RUNNER, else next to macfleet, else on $PATH)")
	f.StringVar(&o.ceiling, "memory-ceiling", "", "the agent's --memory-ceiling, e.g. 12Gi, to see the ceiling it would give")
	f.StringVar(&o.reserve, "memory-reserve", "", "the agent's --memory-reserve (default 4Gi below 24Gi of RAM, else 6Gi)")
	f.BoolVar(&o.opts.SkipSelfTest, "skip-self-test", false, "only measure: do not load, generate with and unload a synthesized model")
	f.DurationVar(&o.opts.SelfTestTimeout, "self-test-timeout", doctor.DefaultSelfTestTimeout, "bound on the whole self-test")
	f.StringVar(&o.opts.Kubeconfig, "kubeconfig", "", "the node's kubeconfig (the agent's --kubeconfig; default $KUBECONFIG): its API server is dialled")
	f.StringVar(&o.opts.AgentListen, "listen", ":8080", "the agent's --listen address, checked free or held by the running agent (\"\" skips)")
	f.BoolVar(&o.opts.SkipServer, "skip-server", false, "leave out the checks of the Mac as a server (sleep, firewall, cluster, agent port)")
	f.DurationVar(&o.opts.NetTimeout, "net-timeout", doctor.DefaultNetTimeout, "bound on each network check")
	f.BoolVar(&o.asJSON, "json", false, "print the report as JSON instead of a table")
	f.IntVarP(&o.verbosity, "verbosity", "v", 0, "log the engine pool and the runner to stderr (1: runner output)")
}

// printDoctorReport runs the report with the options the flags give and prints it;
// it fails with errDoctorFailed when the report found a problem.
func printDoctorReport(cmd *cobra.Command, o *doctorOptions) error {
	opts, err := o.resolve()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := doctor.Run(ctx, opts)
	if err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if o.asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = rep.Write(out)
	}
	if err != nil {
		return err
	}
	if rep.Failed() {
		return errDoctorFailed
	}
	return nil
}

// resolve is the report's options: the flags' sizes parsed, the defaults the
// environment gives filled in, and the logger.
func (o *doctorOptions) resolve() (doctor.Options, error) {
	opts := o.opts
	for _, f := range []struct {
		name, in string
		dst      *int64
	}{{"memory-ceiling", o.ceiling, &opts.CeilingBytes}, {"memory-reserve", o.reserve, &opts.ReserveBytes}} {
		if f.in == "" {
			continue
		}
		v, err := config.ParseSize(f.in)
		if err != nil {
			return doctor.Options{}, fmt.Errorf("--%s: %w", f.name, err)
		}
		*f.dst = int64(v)
	}
	opts.Version = agentVersion()
	if opts.Kubeconfig == "" {
		opts.Kubeconfig = firstPath(os.Getenv("KUBECONFIG"))
	}
	if opts.AgentListen != "" {
		opts.AdvertiseAddress, _ = clustermode.DefaultAdvertiseAddress(opts.AgentListen)
	}
	opts.Executable, _ = resolveExecutable("")
	opts.Log = logr.Discard()
	if o.verbosity > 0 {
		opts.Log = newLogger(o.verbosity)
	}
	return opts, nil
}
