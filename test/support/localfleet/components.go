package localfleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// The manager and gateway processes — killing and restarting them as a crash and
// its supervisor would — and the runner processes the agents started.

// component is the manager or a gateway: a process restarted with the same
// arguments, ready when its readyz answers.
type component struct {
	name string
	// bin is the executable; the fleet's (Options.Binary) when empty.
	bin    string
	args   []string
	readyz string
	proc   *Process
}

// startComponent starts c and waits until it is ready.
func (f *Fleet) startComponent(ctx context.Context, c *component) error {
	f.logf("Starting the %s", c.name)
	bin := c.bin
	if bin == "" {
		bin = f.opts.Binary
	}
	p, err := startProcess(c.name, filepath.Join(f.opts.Dir, "logs", c.name+".log"), bin, c.args,
		[]string{"MACFLEET_RUNNER=" + f.opts.Runner})
	if err != nil {
		return err
	}
	f.mu.Lock()
	c.proc = p
	f.mu.Unlock()
	if err := waitHTTP(ctx, c.readyz, p); err != nil {
		return fmt.Errorf("the %s: %w", c.name, err)
	}
	return nil
}

func (f *Fleet) killComponent(c *component) error {
	f.mu.Lock()
	p := c.proc
	f.mu.Unlock()
	f.logf("Killing the %s", c.name)
	return p.Kill()
}

// KillManager kills the manager with SIGKILL.
func (f *Fleet) KillManager() error { return f.killComponent(f.manager) }

// RestartManager starts the manager again (after KillManager) and waits until it is
// ready.
func (f *Fleet) RestartManager(ctx context.Context) error { return f.startComponent(ctx, f.manager) }

// KillGateway kills gateway replica i (the order of GatewayURLs) with SIGKILL.
func (f *Fleet) KillGateway(i int) error {
	if i < 0 || i >= len(f.gateways) {
		return fmt.Errorf("no gateway %d", i)
	}
	return f.killComponent(f.gateways[i])
}

// RestartGateway starts gateway replica i again on its address and waits until it
// is ready.
func (f *Fleet) RestartGateway(ctx context.Context, i int) error {
	if i < 0 || i >= len(f.gateways) {
		return fmt.Errorf("no gateway %d", i)
	}
	return f.startComponent(ctx, f.gateways[i])
}

// GatewayPID is the process ID of gateway replica i (the order of GatewayURLs).
func (f *Fleet) GatewayPID(i int) (int, error) {
	if i < 0 || i >= len(f.gateways) {
		return 0, fmt.Errorf("no gateway %d", i)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.gateways[i].proc.PID(), nil
}

// Runner is a runner process of one of the fleet's agents.
type Runner struct {
	PID int
	// Node is the Mac whose agent started it.
	Node string
	// Model is the model file it serves.
	Model string
	// Worker says it is a split replica's worker shard (`macfleet-runner worker`),
	// not a runner with an HTTP API.
	Worker bool
}

// Runners lists the runner processes serving a model from one of the fleet's
// stores, alive or zombie, read from /proc (Linux only): each agent's store is under
// the fleet's directory, so the path of a runner's model says whose it is.
func (f *Fleet) Runners() ([]Runner, error) {
	if runtime.GOOS != "linux" {
		return nil, errors.New("localfleet: listing runners needs /proc")
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	agents := filepath.Join(f.opts.Dir, "agents") + string(filepath.Separator)
	var out []Runner
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue // gone meanwhile, or not ours to read
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) < 3 || args[0] != f.opts.Runner {
			continue
		}
		for i := 1; i+1 < len(args); i++ {
			if args[i] != "--model" || !strings.HasPrefix(args[i+1], agents) {
				continue
			}
			node, _, _ := strings.Cut(strings.TrimPrefix(args[i+1], agents), string(filepath.Separator))
			out = append(out, Runner{PID: pid, Node: node, Model: args[i+1], Worker: args[1] == "worker"})
			break
		}
	}
	return out, nil
}
