package main

import (
	"archive/tar"
	"bytes"
	"crypto/x509"
	"io"
	"maps"
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

// testTag is the version the test stamps into the binaries and tags the image with.
const testTag = "v0.0.0-releasetest"

// buildRelease builds macfleet for every release platform as `make release` does
// (static, trimmed, the version stamped by -ldflags) and writes the image.
func buildRelease(t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	dir := t.TempDir()
	binaries := map[string]string{}
	for _, p := range Platforms {
		goos, goarch, _ := strings.Cut(p, "/")
		bin := filepath.Join(dir, goos+"-"+goarch, "macfleet")
		cmd := exec.CommandContext(t.Context(), "go", "build", "-trimpath",
			"-ldflags", "-s -w -X github.com/macfleet/macfleet/internal/version.version="+testTag,
			"-o", bin, "./cmd/macfleet")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building for %s: %v\n%s", p, err, out)
		}
		binaries[p] = bin
	}
	ca, err := caBundle(os.Getenv("CA_CERTS"), SystemCABundles)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "macfleet-image.tar")
	if err := writeImage(out, imageSpec(testTag, time.Unix(1_700_000_000, 0), ca, binaries)); err != nil {
		t.Fatal(err)
	}
	return out
}

// repoRoot is the repository root (a test runs in its package's directory).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// testHelm is the helm the tests package and render the chart with: MACFLEET_HELM, or
// the Makefile's bin/helm.
func testHelm(t *testing.T) string {
	t.Helper()
	helm := os.Getenv("MACFLEET_HELM")
	if helm == "" {
		helm = filepath.Join(repoRoot(t), "bin", "helm")
	}
	if _, err := os.Stat(helm); err != nil {
		t.Fatalf("no helm at %s: run `make helm` or set MACFLEET_HELM", helm)
	}
	return helm
}

// TestReleaseImage opens the release image as a runtime would (index → each platform's
// manifest → configuration → layer), checks each entrypoint is a static executable for
// its architecture, and runs the host platform's entrypoint.
func TestReleaseImage(t *testing.T) {
	path := buildRelease(t)
	img, err := ociimage.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if img.Tag != testTag {
		t.Errorf("tag %q, want %q", img.Tag, testTag)
	}
	if err := checkImage(img); err != nil {
		t.Fatalf("the release image fails its check: %v", err)
	}

	host := "linux/" + runtime.GOARCH
	ran := false
	for _, p := range img.Platforms {
		if runtime.GOOS != "linux" || p.Platform.OS+"/"+p.Platform.Architecture != host {
			continue
		}
		// The entrypoint, as the configuration names it, runs and reports the stamp.
		ep := p.Config.Config.Entrypoint
		bin := filepath.Join(t.TempDir(), filepath.Base(ep[0]))
		if err := os.WriteFile(bin, p.Files[ep[0]].Data, 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := exec.CommandContext(t.Context(), bin, append(ep[1:], "version")...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "macfleet "+testTag) {
			t.Errorf("%s version: %v: %q; want it to print macfleet %s", ep[0], err, out, testTag)
		}
		ran = true
	}
	if runtime.GOOS == "linux" && !ran {
		t.Errorf("no %s image to run", host)
	}

	// Each check can fail: a swapped binary, root, a missing entrypoint.
	amd, arm := img.Platforms[0], img.Platforms[1]
	swapped := arm
	swapped.Files = amd.Files
	asRoot := amd
	asRoot.Config.Config.User = "0:0"
	noEntry := amd
	noEntry.Config.Config.Entrypoint = []string{"/manager"}
	for name, tc := range map[string]struct {
		p    ociimage.PlatformImage
		want string
	}{
		"amd64 binary in the arm64 image": {swapped, "want an executable for EM_AARCH64"},
		"root":                            {asRoot, "non-root"},
		"missing entrypoint":              {noEntry, "/manager is not in the layers"},
	} {
		if err := ociimage.CheckEntrypoint(tc.p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: CheckEntrypoint = %v; want an error containing %q", name, err, tc.want)
		}
	}
	if err := checkImage(&ociimage.Image{Tag: testTag, Platforms: img.Platforms[:1]}); err == nil {
		t.Error("an image without arm64 passed checkImage")
	}
	checkCARoots(t, img)
}

// checkCARoots opens a release image's CA bundle on each platform and parses it into a
// certificate pool, as Go's TLS does through SSL_CERT_FILE; an image without the
// bundle, with an empty one, or without SSL_CERT_FILE fails checkImage.
func checkCARoots(t *testing.T, img *ociimage.Image) {
	t.Helper()
	for _, p := range img.Platforms {
		f, ok := p.Files[imageCABundle]
		if !ok {
			t.Fatalf("%s: no %s in the image", p.Platform.Architecture, imageCABundle)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(f.Data) {
			t.Errorf("%s: %s holds no certificate", p.Platform.Architecture, imageCABundle)
		}
		certs, err := parseCABundle(f.Data)
		if err != nil || len(certs) == 0 {
			t.Errorf("%s: parseCABundle = %d certificates, %v", p.Platform.Architecture, len(certs), err)
		}
		if !slices.Contains(p.Config.Config.Env, "SSL_CERT_FILE="+imageCABundle) {
			t.Errorf("%s: environment %v lacks SSL_CERT_FILE", p.Platform.Architecture, p.Config.Config.Env)
		}
		if err := checkImageCACerts(p); err != nil {
			t.Errorf("%s: %v", p.Platform.Architecture, err)
		}
	}

	amd := img.Platforms[0]
	noBundle, empty, noEnv := amd, amd, amd
	noBundle.Files = maps.Clone(amd.Files)
	delete(noBundle.Files, imageCABundle)
	empty.Files = maps.Clone(amd.Files)
	empty.Files[imageCABundle] = ociimage.File{Mode: 0o644, Data: []byte("# no certificates\n")}
	noEnv.Config.Config.Env = nil
	for name, tc := range map[string]struct {
		p    ociimage.PlatformImage
		want string
	}{
		"no bundle":        {noBundle, "no CA bundle at " + imageCABundle},
		"empty bundle":     {empty, "no PEM certificate"},
		"no SSL_CERT_FILE": {noEnv, "lacks SSL_CERT_FILE"},
	} {
		if err := checkImageCACerts(tc.p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: checkImageCACerts = %v; want an error containing %q", name, err, tc.want)
		}
		if err := checkImage(&ociimage.Image{Tag: testTag, Platforms: []ociimage.PlatformImage{tc.p, img.Platforms[1]}}); err == nil {
			t.Errorf("%s: checkImage passed", name)
		}
	}
}

// TestImageWithoutCABundleFails: on a machine without a CA bundle `release image`
// fails and names the fix, instead of writing an image whose downloads would fail.
func TestImageWithoutCABundleFails(t *testing.T) {
	dir := t.TempDir()
	_, err := caBundle("", []string{filepath.Join(dir, "none.crt"), dir})
	if err == nil || !strings.Contains(err.Error(), "CA_CERTS=FILE") {
		t.Errorf("caBundle with no bundle = %v; want an error naming CA_CERTS", err)
	}
	named := filepath.Join(dir, "mine.crt")
	if got, err := caBundle(named, SystemCABundles); err != nil || got != named {
		t.Errorf("caBundle(%q) = %q, %v; want the named bundle", named, got, err)
	}
	if err := os.WriteFile(named, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "macfleet")
	if err := os.WriteFile(bin, []byte("\x7fELF"), 0o755); err != nil {
		t.Fatal(err)
	}
	err = runImage([]string{"-o", filepath.Join(dir, "image.tar"), "-tag", testTag, "-ca-certs", named,
		"linux/amd64=" + bin, "linux/arm64=" + bin})
	if err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("runImage with a bundle of no certificate = %v; want it refused", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "image.tar")); err == nil {
		t.Error("runImage wrote an image without CA roots")
	}
}

// TestReleaseImageTampered: a blob whose bytes no longer match its digest is refused.
func TestReleaseImageTampered(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "macfleet")
	if err := os.WriteFile(bin, []byte("\x7fELF not really"), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	spec := imageSpec(testTag, time.Unix(0, 0), "", map[string]string{Platforms[0]: bin, Platforms[1]: bin})
	if err := ociimage.Write(&buf, spec, Platforms); err != nil {
		t.Fatal(err)
	}
	// Rewrite the tar with the largest blob (a layer) changed by one byte.
	var out bytes.Buffer
	tr, tw := tar.NewReader(&buf), tar.NewWriter(&out)
	tampered := ""
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if tampered == "" && strings.HasPrefix(h.Name, "blobs/") && h.Size > 200 {
			b[len(b)/2] ^= 1
			tampered = h.Name
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(b)
	}
	_ = tw.Close()
	path := filepath.Join(t.TempDir(), "image.tar")
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ociimage.Open(path)
	if tampered == "" || err == nil || !strings.Contains(err.Error(), "descriptor says") {
		t.Errorf("tampered %q: Open = %v; want a digest mismatch", tampered, err)
	}
}

// TestChartDeploysReleaseImage: the chart, packaged as `make release` packages it,
// deploys by default the image the release builds and the workflow pushes.
func TestChartDeploysReleaseImage(t *testing.T) {
	root := repoRoot(t)
	helm := testHelm(t)
	dir := t.TempDir()
	cmd := exec.CommandContext(t.Context(), helm, "package", filepath.Join(root, "charts", "macfleet"),
		"--version", strings.TrimPrefix(testTag, "v"), "--app-version", testTag, "-d", dir)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+dir, "HELM_CONFIG_HOME="+dir, "HELM_DATA_HOME="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helm package: %v\n%s", err, out)
	}
	chart := filepath.Join(dir, "macfleet-"+strings.TrimPrefix(testTag, "v")+".tgz")
	images, err := chartImages(helm, chart)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkChartImages(images, DefaultRepository+":"+testTag); err != nil {
		t.Error(err)
	}
	if err := checkChartImages(images, "example.com/other:"+testTag); err == nil {
		t.Error("checkChartImages accepted images of another repository")
	}
	// The workflow pushes the image to the same repository.
	wf, err := os.ReadFile(filepath.Join(root, ".github", "workflows", "release.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(wf), "docker://"+DefaultRepository+":") {
		t.Errorf(".github/workflows/release.yml does not push to %s", DefaultRepository)
	}
}
