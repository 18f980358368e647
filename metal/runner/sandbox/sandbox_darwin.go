package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
)

const sandboxExec = "/usr/bin/sandbox-exec"

// Probe reports whether sandbox-exec is there to confine runners.
func Probe() Status {
	if _, err := os.Stat(sandboxExec); err != nil {
		return Status{Detail: "no " + sandboxExec + ": runners run unconfined, with a scrubbed environment"}
	}
	return Status{Mechanism: "seatbelt", Enforced: true, Detail: "a sandbox-exec profile per runner"}
}

// Wrap makes cmd start the runner under sandbox-exec with the runner's Profile.
// cmd.Env must already be the runner's (see Env). Without sandbox-exec, cmd is left
// as it is.
func Wrap(cmd *exec.Cmd, p Policy) error {
	if !Probe().Enforced {
		return nil
	}
	// A missing runner is the exec's error, not a failure inside the launcher.
	if _, err := os.Stat(p.Runner); err != nil {
		return err
	}
	// Seatbelt matches real paths: /tmp and /var are symlinks into /private.
	for _, path := range []*string{&p.Runner, &p.Model, &p.SocketDir, &p.CacheDir} {
		if *path == "" {
			continue
		}
		if abs, err := filepath.Abs(*path); err == nil {
			*path = abs
		}
		if real, err := filepath.EvalSymlinks(*path); err == nil {
			*path = real
		}
	}
	// The runner makes its cache directory when missing; its rule is on the path
	// resolved now.
	if p.CacheDir != "" {
		if err := os.MkdirAll(p.CacheDir, 0o700); err != nil {
			return err
		}
	}
	profile, err := Profile(p)
	if err != nil {
		return err
	}
	// The resolved runner path, the one the profile lets it execute.
	cmd.Args = append([]string{"sandbox-exec", "-p", profile, p.Runner}, cmd.Args[1:]...)
	cmd.Path = sandboxExec
	return nil
}
