package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"debug/macho"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// elfHeader is the 64-byte header of a little-endian 64-bit ELF executable for machine,
// with no sections or segments: enough for debug/elf to say its machine.
func elfHeader(machine elf.Machine) []byte {
	b := make([]byte, 64)
	copy(b, elf.ELFMAG)
	b[elf.EI_CLASS], b[elf.EI_DATA], b[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	binary.LittleEndian.PutUint16(b[16:], uint16(elf.ET_EXEC))
	binary.LittleEndian.PutUint16(b[18:], uint16(machine))
	binary.LittleEndian.PutUint32(b[20:], uint32(elf.EV_CURRENT))
	binary.LittleEndian.PutUint16(b[52:], 64) // e_ehsize
	return b
}

// machoHeader is the 32-byte header of a 64-bit Mach-O executable for cpu, with no
// load commands.
func machoHeader(cpu macho.Cpu) []byte {
	b := make([]byte, 32)
	binary.LittleEndian.PutUint32(b[0:], macho.Magic64)
	binary.LittleEndian.PutUint32(b[4:], uint32(cpu))
	binary.LittleEndian.PutUint32(b[12:], uint32(macho.TypeExec))
	return b
}

func TestExecutablePlatform(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		want string
		err  bool
	}{
		{"elf amd64", elfHeader(elf.EM_X86_64), "linux/amd64", false},
		{"elf arm64", elfHeader(elf.EM_AARCH64), "linux/arm64", false},
		{"elf riscv", elfHeader(elf.EM_RISCV), "", true},
		{"mach-o arm64", machoHeader(macho.CpuArm64), "darwin/arm64", false},
		{"mach-o amd64", machoHeader(macho.CpuAmd64), "darwin/amd64", false},
		{"mach-o ppc", machoHeader(macho.CpuPpc64), "", true},
		{"text", []byte("# macfleet\n"), "", false},
	} {
		got, err := executablePlatform(tc.b)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("%s: executablePlatform = %q, %v; want %q, error %v", tc.name, got, err, tc.want, tc.err)
		}
	}
}

func TestCheckArchiveFiles(t *testing.T) {
	readme := archiveFile{Name: "README.md", Mode: 0o644, Data: []byte("# macfleet\n")}
	bin := func(b []byte) archiveFile { return archiveFile{Name: "macfleet", Mode: 0o755, Data: b} }
	for _, tc := range []struct {
		name     string
		platform string
		files    []archiveFile
		want     string // "" for no error
	}{
		{"darwin arm64", "darwin/arm64", []archiveFile{bin(machoHeader(macho.CpuArm64)), readme}, ""},
		{"linux amd64", "linux/amd64", []archiveFile{readme, bin(elfHeader(elf.EM_X86_64))}, ""},
		{"a linux runner as darwin's", "darwin/arm64", []archiveFile{bin(elfHeader(elf.EM_AARCH64))},
			"macfleet is an executable for linux/arm64; the archive is for darwin/arm64"},
		{"intel for arm", "darwin/arm64", []archiveFile{bin(machoHeader(macho.CpuAmd64)), readme},
			"executable for darwin/amd64"},
		{"no executable", "linux/arm64", []archiveFile{readme}, "no executable for linux/arm64"},
		{"unknown machine", "linux/arm64", []archiveFile{bin(elfHeader(elf.EM_RISCV))}, "an ELF executable for EM_RISCV"},
	} {
		err := checkArchiveFiles(tc.platform, tc.files)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: checkArchiveFiles = %v; want %q", tc.name, err, tc.want)
		}
	}
}

// archiveEntry is what a reader of an archive sees of one entry.
type archiveEntry struct {
	Name     string
	Mode     int64
	Uid, Gid int
	Owner    string
	ModTime  time.Time
	Data     string
}

func readArchive(t *testing.T, b []byte) []archiveEntry {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("the gzip header names %q at %v; want neither (reproducible)", zr.Name, zr.ModTime)
	}
	var out []archiveEntry
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		out = append(out, archiveEntry{h.Name, h.Mode, h.Uid, h.Gid, h.Uname + h.Gname, h.ModTime.UTC(), string(data)})
	}
}

// TestArchiveReproducible: files under the archive's directory in name order, owned
// by root, with the commit's time; the same files in another order give the same bytes.
func TestArchiveReproducible(t *testing.T) {
	mtime := time.Unix(1_700_000_000, 0).UTC()
	files := []archiveFile{
		{Name: "macfleet", Mode: 0o755, Data: []byte("binary")},
		{Name: "README.md", Mode: 0o644, Data: []byte("readme")},
	}
	a, err := writeArchive("macfleet-v1.0.0-darwin-arm64", files, mtime)
	if err != nil {
		t.Fatal(err)
	}
	b, err := writeArchive("macfleet-v1.0.0-darwin-arm64", []archiveFile{files[1], files[0]}, mtime)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("the same files in another order gave other bytes")
	}
	want := []archiveEntry{
		{"macfleet-v1.0.0-darwin-arm64/", 0o755, 0, 0, "", mtime, ""},
		{"macfleet-v1.0.0-darwin-arm64/README.md", 0o644, 0, 0, "", mtime, "readme"},
		{"macfleet-v1.0.0-darwin-arm64/macfleet", 0o755, 0, 0, "", mtime, "binary"},
	}
	if diff := cmp.Diff(want, readArchive(t, a)); diff != "" {
		t.Errorf("archive entries (-want +got):\n%s", diff)
	}
	if _, err := writeArchive("d", []archiveFile{files[0], files[0]}, mtime); err == nil {
		t.Error("writeArchive took a file twice")
	}
}

// TestRunArchive: `release archive` keeps the executable bit, names the directory after
// the archive, and refuses a binary for another platform without writing anything.
func TestRunArchive(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "macfleet")
	readme := filepath.Join(dir, "README.md")
	if err := os.WriteFile(bin, machoHeader(macho.CpuArm64), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(readme, []byte("readme"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "macfleet-v1.0.0-darwin-arm64.tar.gz")
	if err := runArchive([]string{"-o", out, "-platform", "darwin/arm64", "-epoch", "1700000000", bin, readme}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range readArchive(t, b) {
		got = append(got, fmt.Sprintf("%s %o", e.Name, e.Mode))
	}
	want := []string{"macfleet-v1.0.0-darwin-arm64/ 755", "macfleet-v1.0.0-darwin-arm64/README.md 644", "macfleet-v1.0.0-darwin-arm64/macfleet 755"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}

	wrong := filepath.Join(dir, "macfleet-v1.0.0-linux-arm64.tar.gz")
	err = runArchive([]string{"-o", wrong, "-platform", "linux/arm64", bin, readme})
	if err == nil || !strings.Contains(err.Error(), "executable for darwin/arm64; the archive is for linux/arm64") {
		t.Errorf("a darwin binary archived as linux's: %v", err)
	}
	if _, err := os.Stat(wrong); err == nil {
		t.Error("the refused archive was written")
	}
}

// TestSums: SHA256SUMS in sha256sum's format over the directory's files, in name order,
// without its directories or an earlier SHA256SUMS.
func TestSums(t *testing.T) {
	dir := t.TempDir()
	for name, data := range map[string]string{"b.tgz": "chart", "a.tar.gz": "archive", "SHA256SUMS": "old"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "homebrew-tap", "Formula"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := runSums([]string{dir}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for _, name := range []string{"a.tar.gz", "b.tgz"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&want, "%x  %s\n", sha256.Sum256(b), name)
	}
	if diff := cmp.Diff(want.String(), string(got)); diff != "" {
		t.Errorf("SHA256SUMS (-want +got):\n%s", diff)
	}
}
