package sandbox

import (
	"strings"
	"testing"
)

func TestProfile(t *testing.T) {
	base := Policy{Runner: "/opt/macfleet/macfleet-runner", Model: "/Users/a/models/blobs/sha256-ab",
		CacheDir: "/Users/a/cache/m_1", SocketDir: "/private/tmp/mf123"}
	for _, tc := range []struct {
		name        string
		mod         func(*Policy)
		want, never []string
		err         string
	}{
		{name: "unix socket runner", mod: func(*Policy) {},
			want: []string{"(deny default)", `(allow process-exec (literal "/opt/macfleet/macfleet-runner"))`,
				`(allow file-read* (literal "/opt/macfleet/macfleet-runner") (literal "/Users/a/models/blobs/sha256-ab"))`,
				`(allow file-read* file-write* (subpath "/private/tmp/mf123") (subpath "/Users/a/cache/m_1"))`,
				"(allow system-socket (socket-domain AF_UNIX))",
				`(allow network-bind network-inbound (local unix-socket (subpath "/private/tmp/mf123")))`},
			never: []string{"network-outbound", `(local ip`, "AF_INET", "(allow default)", "(allow network*)"}},
		// Metal, every runner's GPU: its user clients, its compiler service, its
		// driver bundles; no other IOKit client, service or file.
		{name: "metal", mod: func(*Policy) {},
			want: []string{"(allow sysctl-read)", "(allow iokit-get-properties)",
				`(allow iokit-open (iokit-user-client-class "AGXDeviceUserClient" "IOSurfaceRootUserClient"))` + "\n",
				`(allow mach-lookup (global-name "com.apple.MTLCompilerService") (xpc-service-name "com.apple.MTLCompilerService"))` + "\n",
				`(allow file-read* (subpath "/System/Library/Extensions") (subpath "/System/Library/Frameworks"))` + "\n"},
			never: []string{"(allow iokit-open)", "(allow mach-lookup)", "file-map-executable", "com.apple.metal"}},
		// The runner's own user cache, where Metal keeps its shaders; not the one
		// every runner of the user shares.
		{name: "metal shader cache", mod: func(p *Policy) { p.MetalCacheDir = "/private/var/folders/zz/x_0/C/macfleet-runner-0a1b2c3d-mf123" },
			want:  []string{`(allow file-read* file-write* (subpath "/private/var/folders/zz/x_0/C/macfleet-runner-0a1b2c3d-mf123"))` + "\n"},
			never: []string{`(subpath "/private/var/folders/zz/x_0/C")`, "com.apple.metal"}},
		// A GPU backend directory: read and mapped as code, never written.
		{name: "backend directory", mod: func(p *Policy) { p.BackendDir = "/opt/macfleet/lib" },
			want:  []string{`(allow file-read* file-map-executable (subpath "/opt/macfleet/lib"))` + "\n"},
			never: []string{`file-write* (subpath "/opt/macfleet/lib")`}},
		{name: "backend directory escaped", mod: func(p *Policy) { p.BackendDir = `/opt/a"b\c)(allow default` },
			want:  []string{`(allow file-read* file-map-executable (subpath "/opt/a\"b\\c)(allow default"))`},
			never: []string{`a"b`}},
		{name: "relative backend directory refused", mod: func(p *Policy) { p.BackendDir = "lib" },
			err: `the runner's backend directory "lib" is not an absolute path`},
		{name: "backend directory with a newline refused", mod: func(p *Policy) { p.BackendDir = "/lib\n(allow default)" },
			err: "control character"},
		{name: "relative Metal cache refused", mod: func(p *Policy) { p.MetalCacheDir = "C/com.apple.metal" },
			err: "Metal cache directory"},
		{name: "Metal cache with a carriage return refused", mod: func(p *Policy) { p.MetalCacheDir = "/c\r" },
			err: "control character"},
		{name: "no cache directory", mod: func(p *Policy) { p.CacheDir = "" },
			want:  []string{`(allow file-read* file-write* (subpath "/private/tmp/mf123"))` + "\n"},
			never: []string{"/Users/a/cache"}},
		{name: "loopback runner listens on localhost only", mod: func(p *Policy) { p.Loopback = true },
			want:  []string{`(allow network-bind network-inbound (local ip "localhost:*"))`},
			never: []string{"network-outbound", `"*:*"`}},
		{name: "split head connects to its workers' loopback ports only", mod: func(p *Policy) { p.ConnectPorts = []uint16{40001, 40002} },
			want: []string{`(allow network-outbound (remote ip "localhost:40001"))`,
				`(allow network-outbound (remote ip "localhost:40002"))`},
			never: []string{`"localhost:*"`, `"*:`, "network-bind network-inbound (local ip", "(allow network-outbound)"}},
		{name: "quotes and backslashes escaped", mod: func(p *Policy) { p.Model = `/m/a"b\c.gguf` },
			want:  []string{`(literal "/m/a\"b\\c.gguf")`},
			never: []string{`a"b`}},
		// A model stored in parts: each part's link and the file it resolves to
		// (Wrap lists both), read only; nothing else of the store.
		{name: "model stored in parts", mod: func(p *Policy) {
			p.Model = "/Users/a/models/blobs/sha256-01"
			p.Parts = []string{"/Users/a/models/parts/h/m-00002-of-00002.gguf", "/Users/a/models/blobs/sha256-02"}
		},
			want: []string{`(allow file-read* (literal "/opt/macfleet/macfleet-runner") (literal "/Users/a/models/blobs/sha256-01") ` +
				`(literal "/Users/a/models/parts/h/m-00002-of-00002.gguf") (literal "/Users/a/models/blobs/sha256-02"))` + "\n"},
			never: []string{`(subpath "/Users/a/models`}},
		{name: "relative part refused", mod: func(p *Policy) { p.Parts = []string{"parts/m-00002-of-00002.gguf"} },
			err: `the runner's model part "parts/m-00002-of-00002.gguf" is not an absolute path`},
		{name: "relative path refused", mod: func(p *Policy) { p.Model = "models/m.gguf" }, err: `the runner's model "models/m.gguf" is not an absolute path`},
		{name: "missing socket directory refused", mod: func(p *Policy) { p.SocketDir = "" }, err: "socket directory"},
		{name: "newline refused", mod: func(p *Policy) { p.CacheDir = "/c\n(allow default)" }, err: "control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := base
			tc.mod(&p)
			got, err := Profile(p)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Profile: %v, want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("profile lacks %s\n%s", w, got)
				}
			}
			for _, n := range tc.never {
				if strings.Contains(got, n) {
					t.Errorf("profile has %s\n%s", n, got)
				}
			}
		})
	}
}
