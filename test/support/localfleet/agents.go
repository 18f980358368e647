package localfleet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// The simulated Macs' agents: minting a Mac's credential, starting, restarting,
// stopping and killing its agent, and reading its log.

// addAgent mints the Mac's credential and starts its agent.
func (f *Fleet) addAgent(ctx context.Context, n Node) error {
	f.logf("Minting a credential for %s", n.Name)
	kc := filepath.Join(f.opts.Dir, n.Name+".kubeconfig")
	if out, err := exec.CommandContext(ctx, f.opts.Binary, "nodes", "credentials", n.Name,
		"--kubeconfig", f.AdminKubeconfig, "--server", f.APIServerURL(), "-o", kc).CombinedOutput(); err != nil {
		return fmt.Errorf("macfleet nodes credentials %s: %w\n%s", n.Name, err, out)
	}
	port, err := freePortOn(f.HostIP)
	if err != nil {
		return err
	}
	a := &Agent{Node: n, Addr: net.JoinHostPort(f.HostIP, strconv.Itoa(port)), Kubeconfig: kc,
		StateDir: filepath.Join(f.opts.Dir, "agents", n.Name, "state")}
	f.mu.Lock()
	f.agents[n.Name] = a
	f.mu.Unlock()
	return f.StartAgent(n.Name)
}

// AddAgent adds a simulated Mac to a running fleet: it mints the Mac's credential,
// starts its agent and waits until its MacNode is Ready.
func (f *Fleet) AddAgent(ctx context.Context, n Node) error {
	if err := f.addAgent(ctx, n); err != nil {
		return err
	}
	return f.WaitNodeReady(ctx, n.Name)
}

// RemoveAgent takes a Mac out of the fleet: it stops its agent (which stops its
// runners) and deletes its MacNode, so that nothing is placed on it any more.
func (f *Fleet) RemoveAgent(ctx context.Context, name string) error {
	a := f.Agent(name)
	if a == nil {
		return fmt.Errorf("no Mac %q in this fleet", name)
	}
	var stopErr error
	if a.proc != nil {
		// Stop kills the agent when it does not stop in time: it is gone either way.
		if err := a.proc.Stop(30 * time.Second); err != nil {
			stopErr = fmt.Errorf("stopping the agent of %s: %w", name, err)
		}
	}
	f.mu.Lock()
	delete(f.agents, name)
	f.mu.Unlock()
	n := &v1alpha1.MacNode{}
	n.Name = name
	return errors.Join(stopErr, client.IgnoreNotFound(f.Client.Delete(ctx, n)))
}

// StartAgent starts (or restarts) the agent of a Mac.
func (f *Fleet) StartAgent(name string) error { return f.StartAgentWith(name, nil, nil) }

// StartAgentWith starts (or restarts) the agent of a Mac with extra environment
// variables (which its runners inherit) and arguments.
func (f *Fleet) StartAgentWith(name string, env, extraArgs []string) error {
	a := f.Agent(name)
	if a == nil {
		return fmt.Errorf("no Mac %q in this fleet", name)
	}
	f.logf("Starting the agent of %s on %s", name, a.Addr)
	base := filepath.Join(f.opts.Dir, "agents", name)
	args := []string{"agent", "--kubeconfig", a.Kubeconfig, "--node-name", name, "--listen", a.Addr,
		"--advertise-address", a.Addr, "--store-dir", filepath.Join(base, "models"), "--state-dir", a.StateDir,
		"--prompt-cache-dir", filepath.Join(base, "prompt-cache"),
		"--memory-ceiling", a.Node.MemoryCeiling, "--runner", f.opts.Runner,
		// One thread a runner, explicitly: the fleet's Macs share one (often busy, often
		// 2-core) host, where ggml's spinning thread barriers collapse a runner given
		// every core (the thread policy's choice on a real Mac).
		"--runner-threads", "1",
		// A fleet that stops is gone for good: its agents take their runners with
		// them. A killed agent leaves them for its successor (see Stop).
		"--keep-runners=false"}
	if a.Node.Chip != "" {
		args = append(args, "--chip", a.Node.Chip)
	}
	if a.Node.UnifiedMemory != "" {
		args = append(args, "--unified-memory", a.Node.UnifiedMemory)
	}
	if f.opts.LeaseDuration > 0 {
		args = append(args, "--lease-duration", f.opts.LeaseDuration.String())
	}
	args = append(append(append(args, f.hubArgs()...), f.opts.AgentArgs...), extraArgs...)
	p, err := f.startEnv("agent-"+name, env, args...)
	if err != nil {
		return err
	}
	f.mu.Lock()
	a.proc = p
	f.mu.Unlock()
	return nil
}

// Agent returns a Mac's agent, nil if there is none.
func (f *Fleet) Agent(name string) *Agent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.agents[name]
}

// Agents returns the agents by Mac name.
func (f *Fleet) Agents() map[string]*Agent {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := make(map[string]*Agent, len(f.agents))
	for k, v := range f.agents {
		m[k] = v
	}
	return m
}

// KillAgent kills a Mac's agent with SIGKILL, as a crash or a pulled cable would
// (its runners are left as they are).
func (f *Fleet) KillAgent(name string) error {
	a := f.Agent(name)
	if a == nil || a.proc == nil {
		return fmt.Errorf("no running agent %q", name)
	}
	f.logf("Killing the agent of %s", name)
	return a.proc.Kill()
}

// StopAgent stops a Mac's agent with SIGTERM and waits for it to exit.
func (f *Fleet) StopAgent(name string, timeout time.Duration) error {
	a := f.Agent(name)
	if a == nil || a.proc == nil {
		return fmt.Errorf("no running agent %q", name)
	}
	return a.proc.Stop(timeout)
}

// AgentLog returns what an agent has logged so far.
func (f *Fleet) AgentLog(name string) string {
	b, _ := os.ReadFile(filepath.Join(f.opts.Dir, "logs", "agent-"+name+".log"))
	return string(b)
}

// PauseAgent stops a Mac's agent with SIGSTOP, as a frozen or sleeping Mac would: its
// connections stay open and nothing answers on them. ResumeAgent sends SIGCONT.
func (f *Fleet) PauseAgent(name string) error { return f.signalAgent(name, syscall.SIGSTOP) }

// ResumeAgent resumes an agent PauseAgent stopped.
func (f *Fleet) ResumeAgent(name string) error { return f.signalAgent(name, syscall.SIGCONT) }

func (f *Fleet) signalAgent(name string, sig syscall.Signal) error {
	a := f.Agent(name)
	if a == nil || a.proc == nil {
		return fmt.Errorf("no running agent %q", name)
	}
	f.logf("Sending %v to the agent of %s", sig, name)
	return syscall.Kill(a.proc.PID(), sig)
}
