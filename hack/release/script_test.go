package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/macfleet/macfleet/internal/ociimage"
)

// macOSCommands are the commands hack/release.sh may find on PATH: those a Mac with the
// command line tools has, with the same flags there as here (tar is the shim below;
// there is no sha256sum).
var macOSCommands = []string{"bash", "env", "go", "git", "rm", "mkdir", "cp", "mv", "cat", "dirname",
	"basename", "uname", "ls", "chmod", "sed", "grep", "head", "tr", "sort", "gzip"}

// bsdTarShim is a tar that takes only the long options macOS's BSD tar (libarchive
// 3.5) takes, and hands them to the real tar at %q: --sort, --owner, --group, --mtime
// and the other GNU-only ones fail as they fail on a Mac.
const bsdTarShim = `#!/bin/bash
for a in "$@"; do
	case $a in
	--*)
		case ${a%%%%=*} in
		--create|--extract|--list|--append|--update|--file|--directory|--cd|--gzip|--bzip2|--xz|--zstd|\
--verbose|--exclude|--include|--format|--uid|--gid|--uname|--gname|--numeric-owner|--options|\
--no-same-owner|--no-same-permissions|--strip-components|--to-stdout|--null|--one-file-system|\
--dereference|--no-xattrs|--no-acls|--no-fflags|--no-mac-metadata|--exclude-vcs|--version|--help) ;;
		*) echo "tar: Option $a is not supported" >&2; echo "usage: tar {-c|-r|-t|-u|-x} ..." >&2; exit 1 ;;
		esac
		case $a in --format=gnu|--format=oldgnu) echo "tar: $a: cannot write" >&2; exit 1 ;; esac ;;
	esac
done
exec %q "$@"
`

// macOSPath is a directory holding only macOSCommands (links to this machine's) and the
// BSD tar shim, to run hack/release.sh as on a Mac.
func macOSPath(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, c := range macOSCommands {
		p, err := exec.LookPath(c)
		if err != nil {
			t.Fatalf("%s: %v (the test runs hack/release.sh with the commands a Mac has)", c, err)
		}
		if err := os.Symlink(p, filepath.Join(dir, c)); err != nil {
			t.Fatal(err)
		}
	}
	realTar, err := exec.LookPath("tar")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tar"), fmt.Appendf(nil, bsdTarShim, realTar), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestBSDTarShim: the shim refuses the archive line hack/release.sh had (GNU tar's
// flags), so the release test below fails on a script that goes back to it, and
// passes the flags both tars take.
func TestBSDTarShim(t *testing.T) {
	path := macOSPath(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@0", "-C", dir, "-cf", "-", "f"}, false},
		{[]string{"--mtime=@0", "-cf", "-", "-C", dir, "f"}, false},
		{[]string{"--format=gnu", "-cf", "-", "-C", dir, "f"}, false},
		{[]string{"--numeric-owner", "--uid", "0", "--gid", "0", "-C", dir, "-cf", "-", "f"}, false}, // GNU tar lacks --uid
		{[]string{"--numeric-owner", "--format=ustar", "-C", dir, "-cf", "-", "f"}, true},
	} {
		cmd := exec.CommandContext(t.Context(), filepath.Join(path, "tar"), tc.args...)
		cmd.Env = append(os.Environ(), "PATH="+path)
		out, err := cmd.CombinedOutput()
		if (err == nil) != tc.ok {
			t.Errorf("tar %s: %v %.200q; want success %v", strings.Join(tc.args, " "), err, out, tc.ok)
		}
	}
}

// TestReleaseScriptOnMacOSTools runs hack/release.sh as `make release` does, with only
// the commands a Mac has on PATH (BSD tar's flags, no sha256sum), and opens what it
// wrote: every archive reproducible and for its platform, SHA256SUMS that sha256sum
// checks, the image with CA roots, and the tap's formula with the archives' sha256s.
func TestReleaseScriptOnMacOSTools(t *testing.T) {
	root := repoRoot(t)
	helm := testHelm(t)
	const version, epoch = "v0.0.0-scripttest", 1_700_000_000
	out := filepath.Join(t.TempDir(), "release")
	cmd := exec.CommandContext(t.Context(), filepath.Join(root, "hack", "release.sh"), out)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PATH="+macOSPath(t), "VERSION="+version, "COMMIT=0123abc", "HELM="+helm,
		fmt.Sprintf("SOURCE_DATE_EPOCH=%d", epoch))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/release.sh: %v\n%s", err, b)
	}

	var archives []string
	for _, p := range CLIPlatforms {
		a := filepath.Join(out, archiveName("macfleet", version, p))
		archives = append(archives, a)
		checkReleaseArchive(t, a, p, time.Unix(epoch, 0).UTC())
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{"SHA256SUMS", "homebrew-tap", "macfleet-0.0.0-scripttest.tgz", "macfleet-image-" + version + ".oci.tar"}
	for _, a := range archives {
		want = append(want, filepath.Base(a))
	}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("the release holds %v; want %v", names, want)
	}

	// The checksums check with the tool a Linux user has.
	if sha, err := exec.LookPath("sha256sum"); err == nil {
		check := exec.CommandContext(t.Context(), sha, "--strict", "-c", "SHA256SUMS")
		check.Dir = out
		if b, err := check.CombinedOutput(); err != nil || strings.Count(string(b), ": OK\n") != len(names)-2 {
			t.Errorf("sha256sum -c SHA256SUMS: %v\n%s", err, b)
		}
	}

	img, err := ociimage.Open(filepath.Join(out, "macfleet-image-"+version+".oci.tar"))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkImage(img); err != nil {
		t.Errorf("the image: %v", err)
	}
	checkCARoots(t, img)
	formula, err := os.ReadFile(filepath.Join(out, "homebrew-tap", "Formula", "macfleet.rb"))
	if err != nil {
		t.Fatal(err)
	}
	checkFormulaSums(t, string(formula), archives)
	rubySyntax(t, filepath.Join(out, "homebrew-tap", "Formula", "macfleet.rb"))
}

// checkReleaseArchive opens a release archive of macfleet: its directory is named after
// it, its entries are root's with the commit's time, its binary is for platform, and on
// this machine's platform the binary runs and says its version.
func checkReleaseArchive(t *testing.T, archive, platform string, mtime time.Time) {
	t.Helper()
	b, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	dir := strings.TrimSuffix(filepath.Base(archive), ".tar.gz")
	var got []string
	for _, e := range readArchive(t, b) {
		got = append(got, e.Name)
		if e.Uid != 0 || e.Gid != 0 || !e.ModTime.Equal(mtime) {
			t.Errorf("%s: %s owned by %d:%d at %v; want 0:0 at %v", archive, e.Name, e.Uid, e.Gid, e.ModTime, mtime)
		}
		if e.Name != dir+"/macfleet" {
			continue
		}
		if p, err := executablePlatform([]byte(e.Data)); p != platform || err != nil {
			t.Errorf("%s: macfleet is for %q (%v); want %s", archive, p, err, platform)
		}
		if platform == runtime.GOOS+"/"+runtime.GOARCH {
			bin := filepath.Join(t.TempDir(), "macfleet")
			if err := os.WriteFile(bin, []byte(e.Data), 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := exec.CommandContext(t.Context(), bin, "version").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "macfleet v0.0.0-scripttest") {
				t.Errorf("%s version: %v %q", archive, err, out)
			}
		}
	}
	want := []string{dir + "/", dir + "/README.md", dir + "/macfleet"}
	if !slices.Equal(got, want) {
		t.Errorf("%s holds %v; want %v", archive, got, want)
	}
}
