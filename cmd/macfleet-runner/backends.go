//go:build cgo && !race

package main

import (
	"os"

	"github.com/macfleet/macfleet/metal/runner/llama"
)

// envBackendDir names the backend directory when --backend-dir is not given.
const envBackendDir = "MACFLEET_BACKEND_DIR"

const backendDirUsage = "the directory of the accelerator backends to load (libggml-cuda.so and its kind; " +
	"default $" + envBackendDir + ", else the folder lib beside this binary); without any the runner computes " +
	"on its compiled-in backends (the CPU, and Metal on a Mac)"

// defaultBackendDir is $MACFLEET_BACKEND_DIR, else the folder lib beside the binary.
func defaultBackendDir() string {
	if d := os.Getenv(envBackendDir); d != "" {
		return d
	}
	exe, err := os.Executable()
	if err != nil {
		return "lib"
	}
	return llama.DefaultBackendDir(exe)
}
