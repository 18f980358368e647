// Package version tells which build of macfleet is running: the release version and
// commit that `make` stamps into every binary with -ldflags (from `git describe`), and
// the Go toolchain that compiled it. A binary built without the stamp (`go build`,
// `go run`, `go test`) reports "dev", or the module version when it was installed with
// `go install …@vX.Y.Z`.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Dev is the version of a build without a release stamp.
const Dev = "dev"

// Set by the linker: -X github.com/macfleet/macfleet/internal/version.version=v0.2.0
// -X github.com/macfleet/macfleet/internal/version.commit=0123abc (Makefile, LDFLAGS).
var (
	version string
	commit  string
)

// Info is one binary's build.
type Info struct {
	// Version is the release (a git tag such as v0.2.0, or `git describe`'s
	// v0.2.0-3-g0123abc between tags), or "dev".
	Version string `json:"version"`
	// Commit is the source commit, empty when unknown.
	Commit string `json:"commit,omitempty"`
	// GoVersion is the toolchain that built the binary (go1.26.0).
	GoVersion string `json:"goVersion"`
	// Platform is GOOS/GOARCH.
	Platform string `json:"platform"`
}

// Get returns this binary's build.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, commit, bi)
}

// String is the one-line form printed by `macfleet version` and `--version`.
func (i Info) String() string {
	s := i.Version
	if i.Commit != "" {
		s += " (commit " + i.Commit + ")"
	}
	return fmt.Sprintf("%s, %s, %s", s, i.GoVersion, i.Platform)
}

// resolve picks the version and commit: the linker's stamp first, then what the Go
// toolchain recorded (the module version of `go install …@v`, the VCS revision of a
// build inside a checkout), then "dev".
func resolve(stampVersion, stampCommit string, bi *debug.BuildInfo) Info {
	info := Info{Version: stampVersion, Commit: stampCommit, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi != nil {
		info.GoVersion = bi.GoVersion
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		if info.Commit == "" {
			info.Commit = setting(bi, "vcs.revision")
			if info.Commit != "" && setting(bi, "vcs.modified") == "true" {
				info.Commit += "-dirty"
			}
		}
	}
	if info.Version == "" {
		info.Version = Dev
	}
	return info
}

func setting(bi *debug.BuildInfo, key string) string {
	for _, s := range bi.Settings {
		if s.Key == key {
			return s.Value
		}
	}
	return ""
}
