package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Metal keeps the shaders it compiles in com.apple.metal under the Darwin user cache
// directory (confstr's _CS_DARWIN_USER_CACHE_DIR). Shared by every runner of the
// agent's user, a runner compromised by its model could write there what another
// tenant's runner then loads as its compiled shaders. The C library moves that
// directory (and the temporary one) into a subdirectory named by
// DIRHELPER_USER_DIR_SUFFIX when the variable is set, as the OS does for its own
// sandboxed helpers: each runner gets one of its own, and its profile grants that
// one only. It is named after the runner's socket directory and made by the agent;
// the agent removes those of its runners that are gone as it starts the next.
const (
	dirSuffixEnv      = "DIRHELPER_USER_DIR_SUFFIX"
	runnerCachePrefix = "macfleet-runner-"
)

// runnerCacheName is the name of the user cache directory of the runner whose
// socket directory is socketDir: prefix (one per directory the agent makes socket
// directories in, so that an agent prunes only its own runners'), then the socket
// directory's name, unique among its running runners.
func runnerCacheName(socketDir string) (prefix, name string) {
	sum := sha256.Sum256([]byte(filepath.Dir(socketDir)))
	prefix = runnerCachePrefix + hex.EncodeToString(sum[:4]) + "-"
	return prefix, prefix + filepath.Base(socketDir)
}

// runnerCacheDir makes the runner's own user cache directory in userCache (empty:
// one left by an earlier runner of the same name is removed first), removes those of
// this agent's runners whose socket directories are gone, and returns the directory
// and the runner's environment variable that points the C library at it.
func runnerCacheDir(userCache, socketDir string) (dir, env string, err error) {
	prefix, name := runnerCacheName(socketDir)
	entries, err := os.ReadDir(userCache)
	if err != nil {
		return "", "", fmt.Errorf("reading the user cache directory: %w", err)
	}
	for _, e := range entries {
		other, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || e.Name() == name {
			continue
		}
		if _, err := os.Lstat(filepath.Join(filepath.Dir(socketDir), other)); errors.Is(err, fs.ErrNotExist) {
			// Best effort: one left now is removed at the next start.
			_ = os.RemoveAll(filepath.Join(userCache, e.Name()))
		}
	}
	dir = filepath.Join(userCache, name)
	if err := os.RemoveAll(dir); err != nil {
		return "", "", fmt.Errorf("clearing the runner's cache directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("making the runner's cache directory: %w", err)
	}
	return dir, dirSuffixEnv + "=" + name, nil
}
