// Command release writes and checks the artifacts of `make release` that need more than
// `go build` and `helm package`, the same on Linux and macOS (hack/release.sh calls no
// tar, gzip or sha256sum, whose flags differ between the two):
//
//	release image -o FILE -tag TAG [-epoch SECONDS] [-ca-certs FILE] linux/amd64=BIN linux/arm64=BIN
//	release check -image FILE -chart CHART.tgz -helm HELM [-repository REPO]
//	release archive -o NAME.tar.gz -platform OS/ARCH [-epoch SECONDS] FILE...
//	release tap -version V -o DIR [-formula SRC] [-url BASE] ARCHIVE...
//	release sums DIR
//
// image writes the container image (internal/ociimage) as an OCI layout tar, without a
// container runtime, with a CA bundle (-ca-certs, else the machine's; none is an
// error). check reads it back as a runtime would — index, each platform's manifest,
// configuration and layer — and fails unless every platform's entrypoint is a static
// executable for its architecture, run as a non-root user, beside a CA bundle that
// parses, and the packaged chart's default image is REPO:TAG. archive writes a
// reproducible tar.gz whose executables must be for OS/ARCH; tap writes the Homebrew
// tap's formula with the archives' checksums; sums writes SHA256SUMS.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/macfleet/macfleet/internal/ociimage"
)

// Platforms are the platforms of the release image, in the index's order.
var Platforms = []string{"linux/amd64", "linux/arm64"}

// DefaultRepository is where the release workflow pushes the image, and the chart's
// default image.repository.
const DefaultRepository = "ghcr.io/macfleet/macfleet"

// imageSpec is the release image's shape: the one static binary as the entrypoint, run
// as distroless's nonroot user (the chart's podSecurityContext uses the same id).
func imageSpec(tag string, epoch time.Time, caCerts string, binaries map[string]string) ociimage.Spec {
	return ociimage.Spec{Tag: tag, Binaries: binaries, BinaryPath: "/macfleet", User: "65532:65532",
		CACerts: caCerts, Created: epoch}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: release image|check|archive|tap|sums [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "image":
		err = runImage(os.Args[2:])
	case "check":
		err = runCheck(os.Args[2:])
	case "archive":
		err = runArchive(os.Args[2:])
	case "tap":
		err = runTap(os.Args[2:])
	case "sums":
		err = runSums(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q: want image, check, archive, tap or sums", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func runImage(args []string) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	out := fs.String("o", "", "the OCI layout tar to write")
	tag := fs.String("tag", "", "the image's tag (the release version)")
	epoch := fs.Int64("epoch", 0, "creation time and files' mtime, seconds since 1970 (the commit's time)")
	caCerts := fs.String("ca-certs", "", "a CA bundle to put at "+imageCABundle+" (default: this machine's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *tag == "" {
		return errors.New("-o and -tag are required")
	}
	binaries := map[string]string{}
	for _, a := range fs.Args() {
		p, bin, ok := strings.Cut(a, "=")
		if !ok || !slices.Contains(Platforms, p) {
			return fmt.Errorf("argument %q: want PLATFORM=BINARY with PLATFORM one of %v", a, Platforms)
		}
		binaries[p] = bin
	}
	ca, err := caBundle(*caCerts, SystemCABundles)
	if err != nil {
		return err
	}
	if err := checkCABundleFile(ca); err != nil {
		return err
	}
	return writeImage(*out, imageSpec(*tag, time.Unix(*epoch, 0), ca, binaries))
}

func writeImage(out string, spec ociimage.Spec) error {
	var buf bytes.Buffer
	if err := ociimage.Write(&buf, spec, Platforms); err != nil {
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}

func runCheck(args []string) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	image := fs.String("image", "", "the OCI layout tar of `release image`")
	chart := fs.String("chart", "", "the packaged chart")
	helm := fs.String("helm", "helm", "the helm binary that renders the chart")
	repo := fs.String("repository", DefaultRepository, "where the image is pushed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	img, err := ociimage.Open(*image)
	if err != nil {
		return err
	}
	if err := checkImage(img); err != nil {
		return err
	}
	images, err := chartImages(*helm, *chart)
	if err != nil {
		return err
	}
	if err := checkChartImages(images, *repo+":"+img.Tag); err != nil {
		return err
	}
	fmt.Printf("%s: %s for %s, with CA roots; the chart deploys it\n", *image, *repo+":"+img.Tag, strings.Join(Platforms, ", "))
	return nil
}

// checkImage says what is wrong with a release image: its platforms are not
// Platforms, in order, a platform's entrypoint would not start, or it lacks CA roots.
func checkImage(img *ociimage.Image) error {
	var got []string
	var errs []error
	for _, p := range img.Platforms {
		name := p.Platform.OS + "/" + p.Platform.Architecture
		got = append(got, name)
		if err := ociimage.CheckEntrypoint(p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		if err := checkImageCACerts(p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	if !slices.Equal(got, Platforms) {
		errs = append(errs, fmt.Errorf("the image's platforms are %v; want %v", got, Platforms))
	}
	if img.Tag == "" {
		errs = append(errs, errors.New("index.json names no tag (org.opencontainers.image.ref.name)"))
	}
	return errors.Join(errs...)
}

// imageLine is a rendered container's image.
var imageLine = regexp.MustCompile(`(?m)^\s+image:\s*"?([^"\s]+)"?\s*$`)

// chartImages renders the chart with its default values and returns its containers'
// images.
func chartImages(helm, chart string) ([]string, error) {
	out, err := exec.Command(helm, "template", "macfleet", chart, "--namespace", "macfleet-system").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("helm template %s: %w: %s", chart, err, ee.Stderr)
		}
		return nil, fmt.Errorf("helm template %s: %w", chart, err)
	}
	var images []string
	for _, m := range imageLine.FindAllStringSubmatch(string(out), -1) {
		images = append(images, m[1])
	}
	return images, nil
}

// checkChartImages says why the chart's rendered images are not all want.
func checkChartImages(images []string, want string) error {
	if len(images) == 0 {
		return errors.New("the chart renders no container image")
	}
	for _, im := range images {
		if im != want {
			return fmt.Errorf("the chart deploys %s by default; the release pushes %s "+
				"(charts/macfleet/values.yaml image.repository, and `helm package --app-version` the tag)", im, want)
		}
	}
	return nil
}
