package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"debug/macho"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The archives are written here rather than by tar(1): GNU tar and the BSD tar of macOS
// share no flags for an owner, a file time or an order, and the same commit must give
// the same bytes on either machine.

// archiveFile is one file of an archive: its name inside the archive's directory, its
// mode and its bytes.
type archiveFile struct {
	Name string
	Mode int64
	Data []byte
}

// writeArchive returns a gzipped tar of files under dir/, in name order, owned by
// root (numerically), every entry with mtime, and no time or name in the gzip header,
// so that the same files give the same bytes.
func writeArchive(dir string, files []archiveFile, mtime time.Time) ([]byte, error) {
	files = slices.Clone(files)
	slices.SortFunc(files, func(a, b archiveFile) int { return strings.Compare(a.Name, b.Name) })
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir + "/", Mode: 0o755,
		ModTime: mtime, Format: tar.FormatUSTAR}); err != nil {
		return nil, err
	}
	for i, f := range files {
		if i > 0 && files[i-1].Name == f.Name {
			return nil, fmt.Errorf("%s is in the archive twice", f.Name)
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: dir + "/" + f.Name, Mode: f.Mode,
			Size: int64(len(f.Data)), ModTime: mtime, Format: tar.FormatUSTAR}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return gz.Bytes(), nil
}

// executablePlatform is the GOOS/GOARCH an executable was built for, "" for a file
// that is neither ELF nor Mach-O (a README).
func executablePlatform(b []byte) (string, error) {
	if f, err := elf.NewFile(bytes.NewReader(b)); err == nil {
		switch f.Machine {
		case elf.EM_X86_64:
			return "linux/amd64", nil
		case elf.EM_AARCH64:
			return "linux/arm64", nil
		}
		return "", fmt.Errorf("an ELF executable for %v", f.Machine)
	}
	if f, err := macho.NewFile(bytes.NewReader(b)); err == nil {
		switch f.Cpu {
		case macho.CpuAmd64:
			return "darwin/amd64", nil
		case macho.CpuArm64:
			return "darwin/arm64", nil
		}
		return "", fmt.Errorf("a Mach-O executable for %v", f.Cpu)
	}
	return "", nil
}

// checkArchiveFiles says why files are not an archive for platform: an executable
// among them is for another platform, or none is an executable.
func checkArchiveFiles(platform string, files []archiveFile) error {
	executables := 0
	for _, f := range files {
		p, err := executablePlatform(f.Data)
		switch {
		case err != nil:
			return fmt.Errorf("%s is %w; the archive is for %s", f.Name, err, platform)
		case p == "":
			continue
		case p != platform:
			return fmt.Errorf("%s is an executable for %s; the archive is for %s", f.Name, p, platform)
		}
		executables++
	}
	if executables == 0 {
		return fmt.Errorf("no executable for %s among %d files", platform, len(files))
	}
	return nil
}

// runArchive: release archive -o FILE.tar.gz -platform OS/ARCH [-epoch SECONDS] FILE...
// writes FILEs under a directory named as FILE less .tar.gz.
func runArchive(args []string) error {
	fs := flag.NewFlagSet("archive", flag.ContinueOnError)
	out := fs.String("o", "", "the archive to write, NAME.tar.gz; its files lie under NAME/")
	platform := fs.String("platform", "", "the OS/ARCH its executables must be built for (darwin/arm64)")
	epoch := fs.Int64("epoch", 0, "every entry's mtime, seconds since 1970 (the commit's time)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir, ok := strings.CutSuffix(filepath.Base(*out), ".tar.gz")
	if !ok || *platform == "" || fs.NArg() == 0 {
		return errors.New("want -o NAME.tar.gz -platform OS/ARCH FILE…")
	}
	var files []archiveFile
	for _, name := range fs.Args() {
		st, err := os.Stat(name)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		mode := int64(0o644)
		if st.Mode()&0o111 != 0 {
			mode = 0o755
		}
		files = append(files, archiveFile{Name: filepath.Base(name), Mode: mode, Data: b})
	}
	if err := checkArchiveFiles(*platform, files); err != nil {
		return fmt.Errorf("%s: %w", *out, err)
	}
	b, err := writeArchive(dir, files, time.Unix(*epoch, 0))
	if err != nil {
		return err
	}
	return os.WriteFile(*out, b, 0o644)
}

// checksums is SHA256SUMS of files, by name, in the format of sha256sum and shasum -a
// 256 ("HEX  NAME"), in name order.
func checksums(files map[string][]byte) string {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		sum := sha256.Sum256(files[n])
		fmt.Fprintf(&b, "%s  %s\n", hex.EncodeToString(sum[:]), n)
	}
	return b.String()
}

// runSums: release sums DIR writes DIR/SHA256SUMS over DIR's regular files (not its
// directories, not an earlier SHA256SUMS) and prints it.
func runSums(args []string) error {
	if len(args) != 1 {
		return errors.New("want the directory to sum")
	}
	entries, err := os.ReadDir(args[0])
	if err != nil {
		return err
	}
	files := map[string][]byte{}
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == "SHA256SUMS" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(args[0], e.Name()))
		if err != nil {
			return err
		}
		files[e.Name()] = b
	}
	sums := checksums(files)
	fmt.Print(sums)
	return os.WriteFile(filepath.Join(args[0], "SHA256SUMS"), []byte(sums), 0o644)
}
