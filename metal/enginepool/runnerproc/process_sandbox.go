package runnerproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool"
	"github.com/macfleet/macfleet/metal/runner/sandbox"
)

// command is the exec.Cmd of a runner: confined by the sandbox unless it is off. A
// failure to confine it is left in cmd.Err, so that cmd.Start fails with it.
func (f *ProcessFactory) command(ctx context.Context, path string, args []string, spec enginepool.ModelSpec, cacheDir, sockDir string, connect []uint16) *exec.Cmd {
	model, worker := spec.Path, spec.SplitWorker
	cmd := exec.Command(path, args...)
	mode, st := f.SandboxStatus()
	log := f.cfg.Log
	if log.GetSink() == nil {
		log = logr.FromContextOrDiscard(ctx)
	}
	f.sandboxLogged.Do(func() {
		switch {
		case mode == sandbox.Off:
			log.Info("Runner sandbox off: runners run unconfined, with the agent's environment")
		case mode == sandbox.AllowedUnconfined:
			log.Info("WARNING: runner sandbox unavailable and "+sandbox.AllowUnconfinedFlag+" given: runners run UNCONFINED, "+
				"able to read what the agent may and (without seccomp) reach the network", "detail", st.Detail)
		case !st.Enforced:
			log.Error(&sandbox.UnconfinedError{Detail: st.Detail}, "Refusing to start runners")
		default:
			log.V(1).Info("Runners are sandboxed", "mechanism", st.Mechanism, "detail", st.Detail)
		}
	})
	if mode == sandbox.Off {
		cmd.Env = append(os.Environ(), f.cfg.Env...)
		return cmd
	}
	if mode == sandbox.On && !st.Enforced {
		cmd.Err = &sandbox.UnconfinedError{Detail: st.Detail}
		return cmd
	}
	// A split head (or chained worker) where the sandbox cannot hold its connects to
	// its workers' ports: refused, or with the operator's leave run with them unconfined.
	if err := sandbox.CheckConnect(st, connect); err != nil {
		if !f.cfg.AllowUnconfined {
			cmd.Err = err
			return cmd
		}
		log.Info("WARNING: the runner sandbox cannot confine TCP connects and "+sandbox.AllowUnconfinedFlag+
			" given: this split runner may connect to any TCP port", "model", spec.Name, "detail", st.Detail)
	}
	// Tracing or not, a runner connects nowhere: its spans leave through the agent
	// (ProcessConfig.SpanRelay).
	cmd.Env = sandbox.Env(os.Environ(), f.cfg.Env)
	// A split worker speaks TCP on loopback (its only transport), as runners do with
	// ProcessConfig.Loopback; a split head connects to its workers through the agent's
	// split link, on loopback only.
	// A model stored in parts is named by its first part: the runner reads the others
	// beside it. A model's projector and its draft model are read as its files.
	parts := sandbox.OtherParts(model)
	for _, f := range []string{spec.ProjectorPath, spec.DraftPath} {
		if f != "" {
			parts = append(parts, f)
		}
	}
	p := sandbox.Policy{Runner: path, Model: model, Parts: parts, CacheDir: cacheDir, SocketDir: sockDir,
		Loopback: f.cfg.Loopback || worker, ConnectPorts: connect, BackendDir: backendDir(path)}
	if err := sandbox.Wrap(cmd, p); err != nil {
		cmd.Err = fmt.Errorf("confining the runner: %w", err)
	}
	return cmd
}

// backendDir is the directory the runner at path loads accelerator backends from (the
// folder lib beside its binary, symlinks resolved as the runner resolves its own
// path), or empty when there is none. The sandbox grants it, and the accelerator's
// devices, only while it holds a backend library.
func backendDir(path string) string {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return ""
	}
	dir, err := filepath.Abs(runnerapi.DefaultBackendDir(real))
	if err != nil {
		return ""
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return ""
	}
	return dir
}

// SandboxStatus is the factory's sandbox mode and, when on, what this machine
// enforces of it: sandbox.AllowedUnconfined when it enforces nothing and the operator
// allowed unconfined runners (sandbox.On with Enforced false: runners are refused).
func (f *ProcessFactory) SandboxStatus() (sandbox.Mode, sandbox.Status) {
	if f.cfg.Sandbox == sandbox.Off {
		return sandbox.Off, sandbox.Status{Detail: "turned off"}
	}
	st := sandbox.Probe()
	if !st.Enforced && f.cfg.AllowUnconfined {
		return sandbox.AllowedUnconfined, st
	}
	return sandbox.On, st
}

// sandboxIdentity is what the adoption fingerprint records of the sandbox: a runner
// started confined differently is not adopted.
func (f *ProcessFactory) sandboxIdentity() string {
	mode, st := f.SandboxStatus()
	if mode == sandbox.Off {
		return ""
	}
	return string(mode) + "/" + st.Mechanism
}
