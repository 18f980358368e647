package runnerapi

import (
	"os"
	"path/filepath"
	"strings"
)

// The accelerator backends a runner loads (libggml-cuda.so and its kind), named here
// once because two sides must agree on them: the runner, which loads them, and the
// agent's sandbox, which grants the backend directory and the device nodes only to a
// runner that will load one.

// BackendDirName is the folder beside the runner binary that holds its backends.
const BackendDirName = "lib"

// DefaultBackendDir is the backend directory of a runner installed at exe.
func DefaultBackendDir(exe string) string { return filepath.Join(filepath.Dir(exe), BackendDirName) }

// BackendPattern is the file name of a dynamic ggml backend library on goos.
func BackendPattern(goos string) string {
	switch goos {
	case "darwin":
		return "libggml-*.dylib"
	case "windows":
		return "ggml-*.dll"
	}
	return "libggml-*.so"
}

// IsBackendLibrary tells a backend library (a name BackendPattern matches) from ggml's
// own base library and from CPU backends, which the runner links in itself: loading a
// second CPU backend would register the CPU twice.
func IsBackendLibrary(name string) bool {
	base := strings.TrimPrefix(name, "lib")
	return !strings.HasPrefix(base, "ggml-base") && !strings.HasPrefix(base, "ggml-cpu")
}

// HoldsBackend reports whether dir holds a backend library for goos.
func HoldsBackend(dir, goos string) bool {
	if dir == "" {
		return false
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if ok, _ := filepath.Match(BackendPattern(goos), e.Name()); ok && !e.IsDir() && IsBackendLibrary(e.Name()) {
			return true
		}
	}
	return false
}
