package version

import (
	"runtime/debug"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestResolve(t *testing.T) {
	const goVersion = "go1.26.0"
	build := func(mainVersion string, settings ...string) *debug.BuildInfo {
		bi := &debug.BuildInfo{GoVersion: goVersion, Main: debug.Module{Version: mainVersion}}
		for i := 0; i+1 < len(settings); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return bi
	}
	for _, tc := range []struct {
		name           string
		stamp, stampC  string
		bi             *debug.BuildInfo
		wantV, wantCmt string
	}{
		{name: "make's stamp wins", stamp: "v0.2.0", stampC: "0123abc",
			bi: build("v0.1.0", "vcs.revision", "fff"), wantV: "v0.2.0", wantCmt: "0123abc"},
		{name: "go install @version", bi: build("v0.2.1"), wantV: "v0.2.1"},
		{name: "go build in a checkout", bi: build("(devel)", "vcs.revision", "abc", "vcs.modified", "false"),
			wantV: Dev, wantCmt: "abc"},
		{name: "dirty checkout", bi: build("(devel)", "vcs.revision", "abc", "vcs.modified", "true"),
			wantV: Dev, wantCmt: "abc-dirty"},
		{name: "test binary", bi: build(""), wantV: Dev},
		{name: "no build info", wantV: Dev},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := resolve(tc.stamp, tc.stampC, tc.bi)
			if diff := cmp.Diff([]string{tc.wantV, tc.wantCmt}, []string{got.Version, got.Commit}); diff != "" {
				t.Errorf("version, commit (-want +got):\n%s", diff)
			}
			if got.Platform == "" || got.GoVersion == "" {
				t.Errorf("platform %q, Go %q: want both", got.Platform, got.GoVersion)
			}
			if tc.bi != nil && got.GoVersion != goVersion {
				t.Errorf("Go version %q, want the build info's %q", got.GoVersion, goVersion)
			}
		})
	}
}

func TestString(t *testing.T) {
	i := Info{Version: "v0.2.0", Commit: "0123abc", GoVersion: "go1.26.0", Platform: "darwin/arm64"}
	if got, want := i.String(), "v0.2.0 (commit 0123abc), go1.26.0, darwin/arm64"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	i.Commit = ""
	if got, want := i.String(), "v0.2.0, go1.26.0, darwin/arm64"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
