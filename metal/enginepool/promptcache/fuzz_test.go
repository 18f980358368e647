package promptcache

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzReadEntry: the Go side of an SSD prompt-cache file — its 96-byte header and
// the checksummed payload — is read back from a directory another process could
// have written. Whatever the file holds, readEntry and checkEntryHeader either
// refuse it as corrupt or return exactly the payload after a header that names this
// identity and key, never a panic, and never allocate more than the file holds.
// (The payload itself is llama.cpp's sequence state, parsed only in C++ by the
// runner; it is not fuzzed here.)
func FuzzReadEntry(f *testing.F) {
	var id [32]byte
	copy(id[:], "identity of the model and engine")
	var key Key
	copy(key[:], "key of the prompt prefix........")
	payload := []byte("state bytes of a prompt prefix")
	valid := append(encodeHeader(id, key, payload), payload...)
	f.Add(valid)
	f.Add(valid[:headerSize])
	huge := bytes.Clone(valid)
	huge[72+7] = 0x40 // a payload of 2^62 bytes
	f.Add(huge)
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, entryFileName(key, 1))
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := readEntry(path, id, key)
		size, herr := checkEntryHeader(path, id, key)
		if err != nil {
			if !errors.Is(err, errCorrupt) {
				t.Fatalf("readEntry: %v, want errCorrupt", err)
			}
			if herr != nil && !errors.Is(herr, errCorrupt) {
				t.Fatalf("checkEntryHeader: %v, want errCorrupt", herr)
			}
			return
		}
		if herr != nil || size != int64(len(data)) {
			t.Fatalf("checkEntryHeader = %d, %v for an entry readEntry accepts", size, herr)
		}
		if !bytes.Equal(got, data[headerSize:]) {
			t.Fatalf("readEntry returned %d bytes, not the file's payload", len(got))
		}
		// Magic, version, identity, key, length and payload checksum are what
		// encodeHeader writes (the reserved bytes are not checked).
		if !bytes.Equal(data[:84], encodeHeader(id, key, got)[:84]) {
			t.Fatalf("accepted a header that encodeHeader would not write")
		}
	})
}

// FuzzParseEntryFileName: a name in the cache directory is a key only when
// entryFileName could have written it.
func FuzzParseEntryFileName(f *testing.F) {
	var key Key
	copy(key[:], "key of the prompt prefix........")
	f.Add(entryFileName(key, 7))
	f.Add("x.kvc")
	f.Fuzz(func(t *testing.T, name string) {
		k, ok := parseEntryFileName(name)
		if !ok {
			return
		}
		var nonce uint32
		for _, c := range name[65:73] {
			nonce = nonce<<4 | uint32(hexVal(c))
		}
		if want := entryFileName(k, nonce); !bytes.EqualFold([]byte(want), []byte(name)) {
			t.Fatalf("parsed %q as key %s, which would be written as %q", name, k, want)
		}
	})
}

func hexVal(c rune) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return 0
}
