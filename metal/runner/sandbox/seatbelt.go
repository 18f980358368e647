package sandbox

import (
	"fmt"
	"path/filepath"
	"strings"
)

// Profile is the Seatbelt (sandbox-exec) profile of one runner on macOS: everything
// is denied but what the runner needs. Paths must be absolute and already resolved
// (Seatbelt matches real paths: /tmp is /private/tmp). A pure function, so that the
// profile is tested on every platform.
func Profile(p Policy) (string, error) {
	for _, path := range []struct {
		what, path string
		optional   bool
	}{
		{"runner", p.Runner, false}, {"model", p.Model, false}, {"socket directory", p.SocketDir, false},
		{"cache directory", p.CacheDir, true}, {"backend directory", p.BackendDir, true},
		{"Metal cache directory", p.MetalCacheDir, true},
	} {
		if path.path == "" && path.optional {
			continue
		}
		if err := checkPath(path.what, path.path); err != nil {
			return "", err
		}
	}
	read := "(literal " + sbString(p.Runner) + ") (literal " + sbString(p.Model) + ")"
	for _, part := range p.Parts {
		if err := checkPath("model part", part); err != nil {
			return "", err
		}
		read += " (literal " + sbString(part) + ")"
	}
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	line("(version 1)")
	line("(deny default)")
	// The base rules of the OS: dyld, the shared cache, system frameworks.
	line(`(import "system.sb")`)
	line("(allow process-exec (literal %s))", sbString(p.Runner))
	line("(allow file-read* %s)", read)
	// Metadata only (stat, path walks): no file's contents.
	line("(allow file-read-metadata)")
	rw := "(subpath " + sbString(p.SocketDir) + ")"
	if p.CacheDir != "" {
		rw += " (subpath " + sbString(p.CacheDir) + ")"
	}
	line("(allow file-read* file-write* %s)", rw)
	line("(allow file-read* file-write-data (literal \"/dev/null\"))")
	// The runner listens on its socket; it connects nowhere.
	line("(allow system-socket (socket-domain AF_UNIX))")
	line("(allow network-bind network-inbound (local unix-socket (subpath %s)))", sbString(p.SocketDir))
	if p.Loopback {
		line("(allow system-socket (socket-domain AF_INET) (socket-domain AF_INET6))")
		line(`(allow network-bind network-inbound (local ip "localhost:*"))`)
	}
	if len(p.ConnectPorts) > 0 {
		line("(allow system-socket (socket-domain AF_INET) (socket-domain AF_INET6))")
		for _, port := range p.ConnectPorts {
			line(`(allow network-outbound (remote ip "localhost:%d"))`, port)
		}
	}
	// Metal, which every runner on a Mac computes with:
	// the machine's description (the CPU count and memory size that Metal, ggml and
	// the Go runtime read; not narrowed yet, as it is untried on a Mac),
	line("(allow sysctl-read)")
	// the GPU's registry properties (its name, its memory, its features),
	line("(allow iokit-get-properties)")
	// the GPU's user clients: the device (command queues, memory) and the shared
	// surfaces its buffers live in,
	line(`(allow iokit-open (iokit-user-client-class "AGXDeviceUserClient" "IOSurfaceRootUserClient"))`)
	// the shader compiler, a service outside the runner (launchd's name for it, and
	// the name of the same service bundled in the Metal framework),
	line(`(allow mach-lookup (global-name "com.apple.MTLCompilerService") (xpc-service-name "com.apple.MTLCompilerService"))`)
	// the GPU's driver bundles and the frameworks that load them,
	line(`(allow file-read* (subpath "/System/Library/Extensions") (subpath "/System/Library/Frameworks"))`)
	// and the runner's own compiled-shader cache (without it the compiler service
	// can stall on its first pipeline), never the one the agent's user shares.
	if p.MetalCacheDir != "" {
		line("(allow file-read* file-write* (subpath %s))", sbString(p.MetalCacheDir))
	}
	// The accelerator backends the runner may load besides (ggml's dynamic backend
	// libraries): read and map as code, nothing written.
	if p.BackendDir != "" {
		line("(allow file-read* file-map-executable (subpath %s))", sbString(p.BackendDir))
	}
	return b.String(), nil
}

// checkPath says why path, the runner's what, cannot be in a profile.
func checkPath(what, path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("the runner's %s %q is not an absolute path", what, path)
	}
	if strings.ContainsAny(path, "\x00\n\r") {
		return fmt.Errorf("the runner's %s %q holds a control character", what, path)
	}
	return nil
}

// sbString quotes s as a Seatbelt string literal.
func sbString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
