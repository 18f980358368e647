package runnerapi

import (
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
)

// The first frame of a split worker's peer link, as the worker protocol defines it
// (metal/runner/netdevice/wire.h, MFND_PEER_HELLO): a 4-byte little-endian payload length,
// the command byte SplitPeerHello and the next worker's session id
// (SplitPeerSessionBytes). The worker Mac's agent reads it before it pipes a peer link
// to its worker: the Mac of the previous worker shard may greet the worker as its
// peer, and open no runner's session with it.
const (
	SplitPeerHello        = 14
	SplitPeerSessionBytes = 16
)

// A worker started with --secret-stdin reads SplitSecretBytes random bytes in hex
// from its standard input (its agent makes them for each worker process and writes
// them there, out of the process's command line and environment), and then reads,
// before anything else on every connection, the frame SplitAuth carrying that
// secret (SplitAuthFrame), within its greeting timeout; any other first bytes close
// the connection before the worker protocol sees a byte. The head's runner and the
// previous worker never hold the secret: the worker Mac's agent, having checked the
// caller's certificate, sends the frame on the loopback connection it opens to its
// worker (agent/splitlink).
const (
	SplitAuth        = 16
	SplitSecretBytes = 32
)

// SplitAuthFrame is the authentication frame carrying secret.
func SplitAuthFrame(secret []byte) []byte {
	f := binary.LittleEndian.AppendUint32(make([]byte, 0, 5+len(secret)), uint32(len(secret)))
	return append(append(f, SplitAuth), secret...)
}

// ReadSplitAuth reads the authentication frame from r and checks it carries secret
// (in constant time); it reads no more than that frame's fixed size.
func ReadSplitAuth(r io.Reader, secret []byte) error {
	frame := make([]byte, 5+SplitSecretBytes)
	if n, err := io.ReadFull(r, frame); err != nil {
		return fmt.Errorf("no authentication frame (%d of its %d bytes): %w", n, len(frame), err)
	}
	if size, cmd := binary.LittleEndian.Uint32(frame), frame[4]; cmd != SplitAuth || size != SplitSecretBytes {
		return fmt.Errorf("the first frame is command %d of %d bytes, not the authentication frame (command %d of %d bytes)",
			cmd, size, SplitAuth, SplitSecretBytes)
	}
	if subtle.ConstantTimeCompare(frame[5:], secret) != 1 {
		return fmt.Errorf("the authentication frame carries the wrong secret")
	}
	return nil
}

// ReadWorkerSecret reads a worker's secret from r: SplitSecretBytes in hex, then a
// newline or the end.
func ReadWorkerSecret(r io.Reader) ([]byte, error) {
	line := make([]byte, 2*SplitSecretBytes+1)
	n, err := io.ReadFull(r, line)
	if err != nil && err != io.ErrUnexpectedEOF {
		return nil, fmt.Errorf("reading the secret: %w", err)
	}
	b, derr := hex.DecodeString(strings.TrimSuffix(string(line[:n]), "\n"))
	if derr != nil || len(b) != SplitSecretBytes {
		return nil, fmt.Errorf("the secret must be %d bytes in hex (%d hex digits) and a newline", SplitSecretBytes, 2*SplitSecretBytes)
	}
	return b, nil
}
