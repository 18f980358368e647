package localfleet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/macfleet/macfleet/test/support/testenv"
)

// Binaries builds the macfleet binary of this checkout into dir and finds the runner
// ($MACFLEET_RUNNER, else bin/macfleet-runner): Options.Binary and Options.Runner for
// a fleet of the code under test.
func Binaries(dir string) (binary, runner string, err error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", "", err
	}
	binary = filepath.Join(dir, "macfleet")
	build := exec.Command("go", "build", "-o", binary, "./cmd/macfleet")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("building macfleet: %w\n%s", err, out)
	}
	runner = os.Getenv("MACFLEET_RUNNER")
	if runner == "" {
		runner = filepath.Join(root, "bin", "macfleet-runner")
	}
	return binary, runner, nil
}
