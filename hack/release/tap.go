package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The Homebrew tap: `make release` writes OUT/homebrew-tap/Formula/macfleet.rb, the
// formula of hack/homebrew/macfleet.rb with the release's version and archives (a url
// and a sha256 per platform). Pushed as the repository ORG/homebrew-tap, it installs
// with `brew install ORG/tap/macfleet`.

// CLIPlatforms are the platforms the release archives macfleet for: the Macs, and the
// admin's machine whatever it is.
var CLIPlatforms = []string{"darwin/arm64", "darwin/amd64", "linux/arm64", "linux/amd64"}

// RunnerPlatform is the one platform of the runner (cgo and Metal: built on a Mac).
const RunnerPlatform = "darwin/arm64"

// releaseMarker is the formula's line that the release's version and archives replace.
const releaseMarker = "  # RELEASE-ARCHIVES"

// archiveName is the name of a release archive of a binary for a platform.
func archiveName(binary, version, platform string) string {
	return binary + "-" + version + "-" + strings.ReplaceAll(platform, "/", "-") + ".tar.gz"
}

// formulaRelease is the formula's stable release: its version and, per OS and CPU, the
// url and sha256 of macfleet's archive and, on Apple Silicon, the runner's as the
// resource "runner" when sums has it. sums are the archives' SHA-256 by name.
func formulaRelease(version, baseURL string, sums map[string]string) (string, error) {
	var missing []string
	for _, p := range CLIPlatforms {
		if sums[archiveName("macfleet", version, p)] == "" {
			missing = append(missing, archiveName("macfleet", version, p))
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("the tap's formula needs every archive of macfleet; missing %s", strings.Join(missing, ", "))
	}
	baseURL = strings.TrimSuffix(baseURL, "/")
	var b strings.Builder
	fmt.Fprintf(&b, "  version %q\n", strings.TrimPrefix(version, "v"))
	for _, goos := range []string{"darwin", "linux"} {
		fmt.Fprintf(&b, "\n  on_%s do\n", map[string]string{"darwin": "macos", "linux": "linux"}[goos])
		for i, arch := range []string{"arm64", "amd64"} {
			if i > 0 {
				b.WriteString("\n")
			}
			fmt.Fprintf(&b, "    on_%s do\n", map[string]string{"arm64": "arm", "amd64": "intel"}[arch])
			name := archiveName("macfleet", version, goos+"/"+arch)
			fmt.Fprintf(&b, "      url %q\n      sha256 %q\n", baseURL+"/"+name, sums[name])
			runner := archiveName("macfleet-runner", version, goos+"/"+arch)
			if goos+"/"+arch == RunnerPlatform && sums[runner] != "" {
				fmt.Fprintf(&b, "\n      resource \"runner\" do\n        url %q\n        sha256 %q\n      end\n",
					baseURL+"/"+runner, sums[runner])
			}
			b.WriteString("    end\n")
		}
		b.WriteString("  end\n")
	}
	return b.String(), nil
}

// renderFormula puts release into the formula source at its marker line.
func renderFormula(source, release string) (string, error) {
	if strings.Count(source, "\n"+releaseMarker+"\n") != 1 {
		return "", fmt.Errorf("the formula has no line %q (or more than one) for the release", strings.TrimSpace(releaseMarker))
	}
	return strings.Replace(source, "\n"+releaseMarker+"\n", "\n"+release, 1), nil
}

// runTap: release tap -version V -formula SRC -o TAPDIR [-url BASE] ARCHIVE...
func runTap(args []string) error {
	fs := flag.NewFlagSet("tap", flag.ContinueOnError)
	version := fs.String("version", "", "the release's version (v0.2.0)")
	source := fs.String("formula", "hack/homebrew/macfleet.rb", "the formula to fill in")
	out := fs.String("o", "", "the tap's directory (its Formula/macfleet.rb is written)")
	baseURL := fs.String("url", "", "where the archives are downloaded from (default: the GitHub release of -version)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version == "" || *out == "" {
		return errors.New("-version and -o are required")
	}
	if *baseURL == "" {
		*baseURL = "https://github.com/macfleet/macfleet/releases/download/" + *version
	}
	sums := map[string]string{}
	for _, a := range fs.Args() {
		b, err := os.ReadFile(a)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		sums[filepath.Base(a)] = hex.EncodeToString(sum[:])
	}
	release, err := formulaRelease(*version, *baseURL, sums)
	if err != nil {
		return err
	}
	if sums[archiveName("macfleet-runner", *version, RunnerPlatform)] == "" {
		fmt.Fprintf(os.Stderr, "release: the tap's formula has no runner (%s is not among the archives: "+
			"build it on a Mac, make runner, and pass RELEASE_RUNNER=bin/macfleet-runner)\n",
			archiveName("macfleet-runner", *version, RunnerPlatform))
	}
	src, err := os.ReadFile(*source)
	if err != nil {
		return err
	}
	formula, err := renderFormula(string(src), release)
	if err != nil {
		return fmt.Errorf("%s: %w", *source, err)
	}
	if err := os.MkdirAll(filepath.Join(*out, "Formula"), 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*out, "Formula", "macfleet.rb"), []byte(formula), 0o644)
}
