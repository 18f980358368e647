package runnerproc

import (
	"os"
	"path/filepath"
	"testing"
)

func TestBackendDir(t *testing.T) {
	root := t.TempDir()
	// A runner installed with its backends, one without, one whose lib is a file,
	// and a link to the first from another directory.
	with, without, fileLib, linked := filepath.Join(root, "with"), filepath.Join(root, "without"),
		filepath.Join(root, "filelib"), filepath.Join(root, "bin")
	for _, d := range []string{filepath.Join(with, "lib"), without, fileLib, linked} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{filepath.Join(with, "macfleet-runner"), filepath.Join(without, "macfleet-runner"),
		filepath.Join(fileLib, "macfleet-runner"), filepath.Join(fileLib, "lib")} {
		if err := os.WriteFile(f, nil, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(with, "macfleet-runner"), filepath.Join(linked, "macfleet-runner")); err != nil {
		t.Fatal(err)
	}
	// Paths are compared resolved: the temporary directory may itself be a link.
	realWith, err := filepath.EvalSymlinks(with)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, runner, want string
	}{
		{"lib beside the runner", filepath.Join(with, "macfleet-runner"), filepath.Join(realWith, "lib")},
		{"beside the linked binary, not the link", filepath.Join(linked, "macfleet-runner"), filepath.Join(realWith, "lib")},
		{"no lib", filepath.Join(without, "macfleet-runner"), ""},
		{"lib is a file", filepath.Join(fileLib, "macfleet-runner"), ""},
		{"no runner", filepath.Join(root, "missing", "macfleet-runner"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := backendDir(tc.runner); got != tc.want {
				t.Errorf("backendDir(%s) = %q, want %q", tc.runner, got, tc.want)
			}
		})
	}
	// A relative runner path gives an absolute directory, the same one.
	t.Chdir(with)
	got := backendDir("./macfleet-runner")
	if real, err := filepath.EvalSymlinks(got); !filepath.IsAbs(got) || err != nil || real != filepath.Join(realWith, "lib") {
		t.Errorf("backendDir(./macfleet-runner) = %q (%v), want %q", got, err, filepath.Join(realWith, "lib"))
	}
}
