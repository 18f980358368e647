// Package ociimage writes and reads the container image of a release without a container
// runtime: an OCI image layout (image-spec v1.1) in one tar file, holding an image index
// with one image per platform, each a single layer with one static binary. `make
// release` writes it (hack/release); a registry client that reads OCI archives pushes
// it (the release workflow), and Check reads it back the way a runtime would.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"
)

// Media types of image-spec v1.1.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
	// AnnotationRefName names the image in index.json (the tag a client copies).
	AnnotationRefName = "org.opencontainers.image.ref.name"
)

// Spec is the image to write.
type Spec struct {
	// Tag is the image's ref name in the layout (v0.2.0).
	Tag string
	// Binaries maps each platform ("linux/amd64") to the static binary for it.
	Binaries map[string]string
	// BinaryPath is where the binary lies in the image and the entrypoint ("/macfleet").
	BinaryPath string
	// User is the user the entrypoint runs as ("65532:65532", non-root).
	User string
	// CACerts, when set, is a CA bundle copied to /etc/ssl/certs/ca-certificates.crt.
	CACerts string
	// Created is the images' creation time and every file's mtime, so that the same
	// inputs give the same bytes (SOURCE_DATE_EPOCH, the commit's time).
	Created time.Time
}

// Descriptor is image-spec's content descriptor.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *Platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Platform is a descriptor's platform.
type Platform struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
}

// Index is an image index (index.json and the multi-platform index blob).
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// Manifest is an image manifest.
type Manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// Config is the part of an image configuration a runtime reads here.
type Config struct {
	Created      string    `json:"created"`
	Architecture string    `json:"architecture"`
	OS           string    `json:"os"`
	Config       RunConfig `json:"config"`
	RootFS       struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// RunConfig is how the image's process starts.
type RunConfig struct {
	User       string   `json:"User,omitempty"`
	Env        []string `json:"Env,omitempty"`
	Entrypoint []string `json:"Entrypoint"`
}

// layout collects the blobs of an OCI image layout.
type layout struct {
	order []string
	blobs map[string][]byte
}

func (l *layout) add(mediaType string, b []byte) Descriptor {
	sum := sha256.Sum256(b)
	d := "sha256:" + hex.EncodeToString(sum[:])
	if _, ok := l.blobs[d]; !ok {
		l.blobs[d] = b
		l.order = append(l.order, d)
	}
	return Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(b))}
}

func (l *layout) addJSON(mediaType string, v any) (Descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return Descriptor{}, err
	}
	return l.add(mediaType, b), nil
}

// Write writes spec's image as an OCI layout tar to w. Platforms are written in the
// order of platforms (every key of spec.Binaries, once).
func Write(w io.Writer, spec Spec, platforms []string) error {
	if len(platforms) != len(spec.Binaries) {
		return fmt.Errorf("platforms %v do not match the binaries' %d", platforms, len(spec.Binaries))
	}
	l := &layout{blobs: map[string][]byte{}}
	image := Index{SchemaVersion: 2, MediaType: MediaTypeIndex}
	for _, p := range platforms {
		bin, ok := spec.Binaries[p]
		if !ok {
			return fmt.Errorf("no binary for platform %s", p)
		}
		d, err := writeImage(l, spec, p, bin)
		if err != nil {
			return fmt.Errorf("image for %s: %w", p, err)
		}
		image.Manifests = append(image.Manifests, d)
	}
	imageDesc, err := l.addJSON(MediaTypeIndex, image)
	if err != nil {
		return err
	}
	imageDesc.Annotations = map[string]string{AnnotationRefName: spec.Tag}
	top, err := json.Marshal(Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{imageDesc}})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	files := []struct {
		name string
		b    []byte
	}{{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)}, {"index.json", top}}
	for _, d := range l.order {
		files = append(files, struct {
			name string
			b    []byte
		}{"blobs/sha256/" + strings.TrimPrefix(d, "sha256:"), l.blobs[d]})
	}
	for _, f := range files {
		if err := writeFile(tw, f.name, 0o644, f.b, spec.Created); err != nil {
			return err
		}
	}
	return tw.Close()
}

// writeImage adds one platform's layer, config and manifest to l.
func writeImage(l *layout, spec Spec, platform, binary string) (Descriptor, error) {
	osName, arch, ok := strings.Cut(platform, "/")
	if !ok {
		return Descriptor{}, fmt.Errorf("platform %q: want OS/ARCH", platform)
	}
	layer, diffID, err := buildLayer(spec, binary)
	if err != nil {
		return Descriptor{}, err
	}
	layerDesc := l.add(MediaTypeLayer, layer)
	cfg := Config{Created: spec.Created.UTC().Format(time.RFC3339), Architecture: arch, OS: osName,
		Config: RunConfig{User: spec.User, Env: []string{"PATH=/"}, Entrypoint: []string{spec.BinaryPath}}}
	if spec.CACerts != "" {
		cfg.Config.Env = append(cfg.Config.Env, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt")
	}
	cfg.RootFS.Type = "layers"
	cfg.RootFS.DiffIDs = []string{diffID}
	cfgDesc, err := l.addJSON(MediaTypeConfig, cfg)
	if err != nil {
		return Descriptor{}, err
	}
	d, err := l.addJSON(MediaTypeManifest, Manifest{SchemaVersion: 2, MediaType: MediaTypeManifest,
		Config: cfgDesc, Layers: []Descriptor{layerDesc}})
	d.Platform = &Platform{OS: osName, Architecture: arch}
	return d, err
}

// passwd names the image's two users, for tools that look the process's user up.
const passwd = "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"

// buildLayer returns the gzipped layer and the digest of its uncompressed tar.
func buildLayer(spec Spec, binary string) (layer []byte, diffID string, err error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, "", err
	}
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, dir := range []struct {
		name string
		mode int64
	}{{"etc/", 0o755}, {"home/", 0o755}, {"tmp/", 0o1777}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir.name, Mode: dir.mode,
			ModTime: spec.Created, Format: tar.FormatPAX}); err != nil {
			return nil, "", err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "home/nonroot/", Mode: 0o700,
		Uid: 65532, Gid: 65532, ModTime: spec.Created, Format: tar.FormatPAX}); err != nil {
		return nil, "", err
	}
	if err := writeFile(tw, "etc/passwd", 0o644, []byte(passwd), spec.Created); err != nil {
		return nil, "", err
	}
	if spec.CACerts != "" {
		certs, err := os.ReadFile(spec.CACerts)
		if err != nil {
			return nil, "", err
		}
		for _, dir := range []string{"etc/ssl/", "etc/ssl/certs/"} {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755,
				ModTime: spec.Created, Format: tar.FormatPAX}); err != nil {
				return nil, "", err
			}
		}
		if err := writeFile(tw, "etc/ssl/certs/ca-certificates.crt", 0o644, certs, spec.Created); err != nil {
			return nil, "", err
		}
	}
	if err := writeFile(tw, path.Clean(strings.TrimPrefix(spec.BinaryPath, "/")), 0o755, bin, spec.Created); err != nil {
		return nil, "", err
	}
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(raw.Bytes())
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, "", err
	}
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, "", err
	}
	if err := zw.Close(); err != nil {
		return nil, "", err
	}
	return gz.Bytes(), "sha256:" + hex.EncodeToString(sum[:]), nil
}

func writeFile(tw *tar.Writer, name string, mode int64, b []byte, mtime time.Time) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(b)),
		ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err := tw.Write(b)
	return err
}
