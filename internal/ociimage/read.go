package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// Image is an OCI layout read back: the ref name of index.json and, per platform, the
// manifest, the configuration and the files of its layers.
type Image struct {
	Tag       string
	Platforms []PlatformImage
}

// PlatformImage is one platform's image of an index.
type PlatformImage struct {
	Platform Platform
	Manifest Manifest
	Config   Config
	// Files are the layers' regular files by absolute path.
	Files map[string]File
}

// File is a regular file of a layer.
type File struct {
	Mode int64
	Data []byte
}

// Open reads the OCI layout tar at name, checking every blob it reads against its
// descriptor's digest and size and each layer against its configuration's diff_id.
func Open(name string) (*Image, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", name, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if entries[h.Name], err = io.ReadAll(tr); err != nil {
			return nil, fmt.Errorf("reading %s: %s: %w", name, h.Name, err)
		}
	}
	if string(entries["oci-layout"]) == "" {
		return nil, fmt.Errorf("%s is not an OCI image layout: no oci-layout file", name)
	}
	var top Index
	if err := json.Unmarshal(entries["index.json"], &top); err != nil {
		return nil, fmt.Errorf("%s: index.json: %w", name, err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != MediaTypeIndex {
		return nil, fmt.Errorf("%s: index.json holds %d manifests; want one image index", name, len(top.Manifests))
	}
	r := reader{entries: entries}
	var image Index
	if err := r.json(top.Manifests[0], &image); err != nil {
		return nil, err
	}
	img := &Image{Tag: top.Manifests[0].Annotations[AnnotationRefName]}
	for _, d := range image.Manifests {
		if d.Platform == nil {
			return nil, fmt.Errorf("manifest %s has no platform", d.Digest)
		}
		p, err := r.platform(d)
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", d.Platform.OS, d.Platform.Architecture, err)
		}
		img.Platforms = append(img.Platforms, p)
	}
	return img, nil
}

type reader struct{ entries map[string][]byte }

func (r reader) blob(d Descriptor) ([]byte, error) {
	hexSum, ok := strings.CutPrefix(d.Digest, "sha256:")
	if !ok {
		return nil, fmt.Errorf("digest %q is not sha256", d.Digest)
	}
	b, ok := r.entries["blobs/sha256/"+hexSum]
	if !ok {
		return nil, fmt.Errorf("blob %s is missing", d.Digest)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != hexSum || int64(len(b)) != d.Size {
		return nil, fmt.Errorf("blob %s: content is sha256:%s of %d bytes, descriptor says %d", d.Digest, got, len(b), d.Size)
	}
	return b, nil
}

func (r reader) json(d Descriptor, v any) error {
	b, err := r.blob(d)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s %s: %w", d.MediaType, d.Digest, err)
	}
	return nil
}

func (r reader) platform(d Descriptor) (PlatformImage, error) {
	p := PlatformImage{Platform: *d.Platform, Files: map[string]File{}}
	if err := r.json(d, &p.Manifest); err != nil {
		return p, err
	}
	if err := r.json(p.Manifest.Config, &p.Config); err != nil {
		return p, err
	}
	if len(p.Manifest.Layers) != len(p.Config.RootFS.DiffIDs) {
		return p, fmt.Errorf("%d layers but %d diff_ids", len(p.Manifest.Layers), len(p.Config.RootFS.DiffIDs))
	}
	for i, l := range p.Manifest.Layers {
		gz, err := r.blob(l)
		if err != nil {
			return p, err
		}
		if err := readLayer(gz, p.Config.RootFS.DiffIDs[i], p.Files); err != nil {
			return p, fmt.Errorf("layer %s: %w", l.Digest, err)
		}
	}
	return p, nil
}

func readLayer(gz []byte, diffID string, files map[string]File) error {
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return err
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return err
	}
	if sum := sha256.Sum256(raw); "sha256:"+hex.EncodeToString(sum[:]) != diffID {
		return fmt.Errorf("uncompressed layer does not match diff_id %s", diffID)
	}
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		files[path.Join("/", h.Name)] = File{Mode: h.Mode, Data: b}
	}
}

// elfMachines are the ELF machines of the architectures a release builds.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// CheckEntrypoint says why p's entrypoint would not start on its platform: missing from
// the layers, not executable, not an ELF executable for the platform's architecture, or
// run as root. Nil when it would.
func CheckEntrypoint(p PlatformImage) error {
	ep := p.Config.Config.Entrypoint
	if len(ep) == 0 {
		return errors.New("the configuration has no entrypoint")
	}
	f, ok := p.Files[ep[0]]
	switch {
	case !ok:
		return fmt.Errorf("entrypoint %s is not in the layers", ep[0])
	case f.Mode&0o111 == 0:
		return fmt.Errorf("entrypoint %s is not executable (mode %o)", ep[0], f.Mode)
	case p.Config.OS != p.Platform.OS || p.Config.Architecture != p.Platform.Architecture:
		return fmt.Errorf("configuration says %s/%s, the index %s/%s",
			p.Config.OS, p.Config.Architecture, p.Platform.OS, p.Platform.Architecture)
	case p.Config.Config.User == "" || strings.HasPrefix(p.Config.Config.User, "0"):
		return fmt.Errorf("runs as user %q; want a non-root user", p.Config.Config.User)
	}
	want, ok := elfMachines[p.Platform.Architecture]
	if !ok || p.Platform.OS != "linux" {
		return fmt.Errorf("platform %s/%s is not one a release builds", p.Platform.OS, p.Platform.Architecture)
	}
	ef, err := elf.NewFile(bytes.NewReader(f.Data))
	if err != nil {
		return fmt.Errorf("entrypoint %s is not an ELF file: %w", ep[0], err)
	}
	if ef.Machine != want || ef.Type != elf.ET_EXEC {
		return fmt.Errorf("entrypoint %s is an ELF %s for %s; want an executable for %s", ep[0], ef.Type, ef.Machine, want)
	}
	for _, prog := range ef.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("entrypoint %s is linked dynamically; the image has no loader (build with CGO_ENABLED=0)", ep[0])
		}
	}
	return nil
}
