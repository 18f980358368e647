package runnerproc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ResolveRunnerPath finds the runner binary: configured if set (looked up on $PATH when
// it is a bare name), else $MACFLEET_RUNNER, else macfleet-runner next to the running
// executable, else macfleet-runner on $PATH.
func ResolveRunnerPath(configured string) (string, error) {
	if configured == "" {
		configured = os.Getenv(RunnerEnv)
	}
	if configured != "" {
		if !strings.ContainsRune(configured, os.PathSeparator) {
			return exec.LookPath(configured)
		}
		return configured, nil
	}
	if exe, err := os.Executable(); err == nil {
		cand := filepath.Join(filepath.Dir(exe), "macfleet-runner")
		if fi, err := os.Stat(cand); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return cand, nil
		}
	}
	p, err := exec.LookPath("macfleet-runner")
	if err != nil {
		return "", fmt.Errorf("finding the runner (set %s or put macfleet-runner next to the agent): %w", RunnerEnv, err)
	}
	return p, nil
}

// RunnerExecutable is ResolveRunnerPath, checked: the path must be an executable
// regular file, so that an agent refuses to start without a runner instead of failing
// every load.
func RunnerExecutable(configured string) (string, error) {
	path, err := ResolveRunnerPath(configured)
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("the runner binary: %w", err)
	} else if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("the runner binary %s is not an executable file", path)
	}
	return path, nil
}
