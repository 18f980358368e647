//go:build cgo && !race

package llama

/*
#cgo linux LDFLAGS: -ldl
#include <stdlib.h>
#include <dlfcn.h>
#include "ggml-backend.h"
#include "devicemem.h"

// mf_backend_probe opens a backend library the way ggml will, to name why it cannot
// be used before ggml tries: the loader's own error (a missing dependency, a wrong
// architecture), or a library that is no ggml backend. The handle stays open (ggml's
// own dlopen takes a second reference), so nothing runs its initializers twice.
static const char *mf_backend_probe(const char *path) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		return e != NULL ? e : "the dynamic loader refused it";
	}
	if (dlsym(h, "ggml_backend_init") == NULL) {
		return "no ggml_backend_init symbol: not a ggml backend";
	}
	typedef int (*score_fn)(void);
	score_fn score = (score_fn)dlsym(h, "ggml_backend_score");
	if (score != NULL && score() == 0) {
		return "the backend found no device it supports on this machine";
	}
	return NULL;
}

static int mf_dev_is_gpu(ggml_backend_dev_t d) {
	enum ggml_backend_dev_type t = ggml_backend_dev_type(d);
	return t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU;
}
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"unsafe"

	"github.com/macfleet/macfleet/api/runnerapi"
)

// Backend is one dynamic ggml backend library found in the backend directory.
type Backend struct {
	// File is the library's path.
	File string `json:"file"`
	// Name is the backend's registered name (CUDA, Vulkan …); empty when it failed.
	Name string `json:"name,omitempty"`
	// Error says why the library was not used; empty when it loaded.
	Error string `json:"error,omitempty"`
}

// Device is one accelerator ggml registered (compiled in, as Metal, or loaded).
type Device struct {
	// Name is ggml's device name (CUDA0, Metal …), Description the hardware's
	// (the card's or the chip's name).
	Name        string `json:"name"`
	Description string `json:"description"`
	// TotalBytes and FreeBytes are the device's memory as its backend reports it: a
	// card's own memory, or on unified memory the share the GPU may use.
	TotalBytes uint64 `json:"totalBytes"`
	FreeBytes  uint64 `json:"freeBytes"`
}

// BackendReport is what LoadBackends found.
type BackendReport struct {
	// Dir is the directory searched.
	Dir string
	// Backends are the libraries found there, loaded or not, sorted by file.
	Backends []Backend
}

// Loaded is the number of backends that loaded.
func (r BackendReport) Loaded() int {
	n := 0
	for _, b := range r.Backends {
		if b.Error == "" {
			n++
		}
	}
	return n
}

// Summary is one line for the runner's log: what loaded, what did not and why, or
// that the runner computes on the CPU (and Metal, where it is compiled in).
func (r BackendReport) Summary() string {
	if len(r.Backends) == 0 {
		return fmt.Sprintf("no accelerator backend in %s (no %s there): computing with the compiled-in backends only (%s)",
			r.Dir, runnerapi.BackendPattern(runtime.GOOS), compiledIn())
	}
	parts := make([]string, 0, len(r.Backends))
	for _, b := range r.Backends {
		if b.Error != "" {
			parts = append(parts, fmt.Sprintf("%s not loaded: %s", filepath.Base(b.File), b.Error))
		} else {
			parts = append(parts, fmt.Sprintf("%s loaded (%s)", filepath.Base(b.File), b.Name))
		}
	}
	return "backends in " + r.Dir + ": " + strings.Join(parts, "; ")
}

func compiledIn() string {
	if runtime.GOOS == "darwin" && runtime.GOARCH == "arm64" {
		return "CPU and Metal"
	}
	return "CPU"
}

// DefaultBackendDir is the backend directory of a runner installed at exe: the
// folder lib beside it.
func DefaultBackendDir(exe string) string { return runnerapi.DefaultBackendDir(exe) }

// LoadBackends registers every dynamic ggml backend library in dir (libggml-cuda.so
// and its kind) with ggml, before any model loads. A directory that is missing or
// holds none leaves the runner on its compiled-in backends, as before; a library
// that cannot be used is reported with the loader's reason and skipped. Call it once,
// before Init.
func LoadBackends(dir string) BackendReport {
	rep := BackendReport{Dir: dir}
	files, _ := filepath.Glob(filepath.Join(dir, runnerapi.BackendPattern(runtime.GOOS)))
	sort.Strings(files)
	for _, f := range files {
		if !runnerapi.IsBackendLibrary(filepath.Base(f)) {
			continue
		}
		rep.Backends = append(rep.Backends, loadBackend(f))
	}
	return rep
}

func loadBackend(file string) Backend {
	b := Backend{File: file}
	if st, err := os.Stat(file); err != nil || !st.Mode().IsRegular() {
		b.Error = "not a regular file"
		return b
	}
	cpath := C.CString(file)
	defer C.free(unsafe.Pointer(cpath))
	if e := C.mf_backend_probe(cpath); e != nil {
		b.Error = C.GoString(e)
		return b
	}
	reg := C.ggml_backend_load(cpath)
	if reg == nil {
		b.Error = "ggml refused it (an incompatible ggml API version; the runner's log has ggml's line)"
		return b
	}
	b.Name = C.GoString(C.ggml_backend_reg_name(reg))
	return b
}

// Devices are the accelerators ggml has registered, in registry order (the order
// GPUDevices uses).
func Devices() []Device {
	var out []Device
	for i := range int(C.ggml_backend_dev_count()) {
		d := C.ggml_backend_dev_get(C.size_t(i))
		if C.mf_dev_is_gpu(d) == 0 {
			continue
		}
		var free, total C.size_t
		C.ggml_backend_dev_memory(d, &free, &total)
		out = append(out, Device{
			Name: C.GoString(C.ggml_backend_dev_name(d)), Description: C.GoString(C.ggml_backend_dev_description(d)),
			TotalBytes: uint64(total), FreeBytes: uint64(free),
		})
	}
	return out
}

// DeviceBytes is the size of the model's weights in accelerator buffers (zero when
// every layer computes on the CPU, or the accelerator's memory is the host's).
func (m *Model) DeviceBytes() uint64 { return uint64(C.mf_model_device_bytes(m.c)) }

// DeviceBytes is the size of the context's KV cache and compute buffers on
// accelerators; the model's weights are the Model's.
func (c *Context) DeviceBytes() uint64 { return uint64(C.mf_context_device_bytes(c.c)) }
