package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/macfleet/macfleet/api/runnerapi"
)

const (
	sandboxExec = "/usr/bin/sandbox-exec"
)

// userCacheDir is this user's Darwin user cache directory (confstr's
// _CS_DARWIN_USER_CACHE_DIR, which getconf prints; asked without
// DIRHELPER_USER_DIR_SUFFIX, which would move it), resolved; empty when getconf
// cannot say. Each runner's own cache directory is made in it (runnerCacheDir).
var userCacheDir = sync.OnceValue(func() string {
	cmd := exec.Command("/usr/bin/getconf", "DARWIN_USER_CACHE_DIR")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, dirSuffixEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || !filepath.IsAbs(dir) {
		return ""
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	return filepath.Clean(dir)
})

// probe reports whether sandbox-exec is there to confine runners.
func probe() Status {
	if _, err := os.Stat(sandboxExec); err != nil {
		return Status{Detail: "no " + sandboxExec}
	}
	// A profile holds a split head's connects to its workers' ports (Policy.ConnectPorts).
	return Status{Mechanism: "seatbelt", Enforced: true, ConnectConfined: true, Detail: "a sandbox-exec profile per runner"}
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
	// A backend directory without a backend (a CPU runner's) grants nothing.
	if !runnerapi.HoldsBackend(p.BackendDir, runtime.GOOS) {
		p.BackendDir = ""
	}
	// Seatbelt matches real paths: /tmp and /var are symlinks into /private.
	for _, path := range []*string{&p.Runner, &p.Model, &p.SocketDir, &p.CacheDir, &p.BackendDir} {
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
	// A part is named by a link (the store's): the link and the file it resolves to.
	p.Parts = resolvedParts(p.Parts)
	// The runner makes its cache directory when missing; its rule is on the path
	// resolved now.
	if p.CacheDir != "" {
		if err := os.MkdirAll(p.CacheDir, 0o700); err != nil {
			return err
		}
	}
	// The runner's own user cache directory, where Metal keeps its shaders: no
	// runner loads what another compiled (metalcache.go).
	if base := userCacheDir(); p.MetalCacheDir == "" && base != "" {
		dir, env, err := runnerCacheDir(base, p.SocketDir)
		if err != nil {
			return err
		}
		p.MetalCacheDir = dir
		cmd.Env = append(cmd.Env, env)
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

// resolvedParts are the absolute paths of parts and, where one is a link, the file it
// resolves to (the path Seatbelt matches).
func resolvedParts(parts []string) []string {
	out := make([]string, 0, 2*len(parts))
	for _, part := range parts {
		if abs, err := filepath.Abs(part); err == nil {
			part = abs
		}
		out = append(out, part)
		if real, err := filepath.EvalSymlinks(part); err == nil && real != part {
			out = append(out, real)
		}
	}
	return out
}
