package promptcache

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"strings"
)

// An SSD file is a fixed header followed by the payload (the state bytes):
//
//	0   magic "MFPC"
//	4   format version (uint32, little endian)
//	8   identity hash (32 bytes)
//	40  key (32 bytes)
//	72  payload length (uint64)
//	80  CRC-32C of the payload (uint32)
//	84  reserved (8 bytes, zero)
//	92  CRC-32C of bytes 0..92 (uint32)
//	96  payload
//
// A file whose size, magic, version, identity, key or checksums do not match is
// corrupt: a miss, and removed.
const (
	headerSize    = 96
	fileMagic     = "MFPC"
	formatVersion = 1
	fileSuffix    = ".kvc"
	tempSuffix    = ".tmp"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errCorrupt marks a file that exists but is not a valid entry.
var errCorrupt = errors.New("corrupt prompt cache file")

func encodeHeader(id [32]byte, key Key, payload []byte) []byte {
	h := make([]byte, headerSize)
	copy(h[0:4], fileMagic)
	binary.LittleEndian.PutUint32(h[4:8], formatVersion)
	copy(h[8:40], id[:])
	copy(h[40:72], key[:])
	binary.LittleEndian.PutUint64(h[72:80], uint64(len(payload)))
	binary.LittleEndian.PutUint32(h[80:84], crc32.Checksum(payload, castagnoli))
	binary.LittleEndian.PutUint32(h[92:96], crc32.Checksum(h[:92], castagnoli))
	return h
}

// parseHeader checks a header against the identity and key (and the file size when
// size >= 0) and returns the payload length and checksum.
func parseHeader(h []byte, id [32]byte, key Key, size int64) (int64, uint32, error) {
	if len(h) < headerSize {
		return 0, 0, fmt.Errorf("%w: short header", errCorrupt)
	}
	if string(h[0:4]) != fileMagic {
		return 0, 0, fmt.Errorf("%w: bad magic", errCorrupt)
	}
	if crc32.Checksum(h[:92], castagnoli) != binary.LittleEndian.Uint32(h[92:96]) {
		return 0, 0, fmt.Errorf("%w: header checksum mismatch", errCorrupt)
	}
	if v := binary.LittleEndian.Uint32(h[4:8]); v != formatVersion {
		return 0, 0, fmt.Errorf("%w: format version %d", errCorrupt, v)
	}
	if [32]byte(h[8:40]) != id {
		return 0, 0, fmt.Errorf("%w: another identity", errCorrupt)
	}
	if Key(h[40:72]) != key {
		return 0, 0, fmt.Errorf("%w: another key", errCorrupt)
	}
	n := binary.LittleEndian.Uint64(h[72:80])
	if n > 1<<50 || (size >= 0 && uint64(size) != headerSize+n) {
		return 0, 0, fmt.Errorf("%w: length %d does not match file size %d", errCorrupt, n, size)
	}
	return int64(n), binary.LittleEndian.Uint32(h[80:84]), nil
}

// readEntry reads and verifies one file. A missing file is returned as is
// (os.ErrNotExist); anything else wrong with it wraps errCorrupt.
func readEntry(path string, id [32]byte, key Key) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	var h [headerSize]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		return nil, fmt.Errorf("%w: reading header: %v", errCorrupt, err)
	}
	n, sum, err := parseHeader(h[:], id, key, st.Size())
	if err != nil {
		return nil, err
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, fmt.Errorf("%w: reading payload: %v", errCorrupt, err)
	}
	if crc32.Checksum(data, castagnoli) != sum {
		return nil, fmt.Errorf("%w: payload checksum mismatch", errCorrupt)
	}
	return data, nil
}

// checkEntryHeader verifies only the header and size of a file (used when the index
// is rebuilt on Open, without reading every payload).
func checkEntryHeader(path string, id [32]byte, key Key) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errCorrupt, err)
	}
	var h [headerSize]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		return 0, fmt.Errorf("%w: reading header: %v", errCorrupt, err)
	}
	if _, _, err := parseHeader(h[:], id, key, st.Size()); err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// writeEntryFile creates path (which must not exist) with header and payload.
func writeEntryFile(path string, header, payload []byte, sync bool) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(header)
	if err == nil {
		_, err = f.Write(payload)
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// entryFileName is "<key hex>-<8 hex>.kvc": every write gets its own name, so a
// cancelled write that still renames into place only ever removes its own file.
func entryFileName(key Key, nonce uint32) string {
	return fmt.Sprintf("%s-%08x%s", key, nonce, fileSuffix)
}

// parseEntryFileName returns the key of a file named by entryFileName.
func parseEntryFileName(name string) (Key, bool) {
	var k Key
	if !strings.HasSuffix(name, fileSuffix) || len(name) != 64+1+8+len(fileSuffix) || name[64] != '-' {
		return k, false
	}
	if _, err := hex.Decode(k[:], []byte(name[:64])); err != nil {
		return k, false
	}
	if _, err := hex.DecodeString(name[65:73]); err != nil {
		return k, false
	}
	return k, true
}
