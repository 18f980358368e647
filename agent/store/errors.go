package store

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// The error types below are what a caller branches on (errors.As); their messages are
// written to be put into a condition message as they are.

// ChecksumError is a file whose SHA-256 is not the one expected. The store deletes a
// downloaded file that fails the check; retrying cannot help.
type ChecksumError struct {
	// Source is the model source being fetched.
	Source string
	// Expected and Got are lowercase hex digests.
	Expected, Got string
	// Of says what was hashed: "downloaded file", "file" (file:// sources) or
	// "registry manifest" (an ollama model layer whose digest contradicts the one asked for).
	Of string
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("sha256 mismatch for %s: expected %s, %s has %s", e.Source, e.Expected, e.Of, e.Got)
}

// DigestError is a sha256 argument, or a registry digest, that cannot be used.
type DigestError struct {
	Source string
	Digest string
	Reason string
}

func (e *DigestError) Error() string {
	return fmt.Sprintf("%s: digest %q %s", e.Source, e.Digest, e.Reason)
}

// FormatError is a file that is not a GGUF model: a login page served with 200, a
// truncated or wrong file. It never carries the file's bytes: its message ends up in
// status, which other users may read.
type FormatError struct {
	// Location is the path or URL the file came from.
	Location string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("%s is not a GGUF file: it does not start with the GGUF magic", e.Location)
}

// LocalFileError is a file:// source that cannot be used as a model: missing, not a
// regular file, unreadable.
type LocalFileError struct {
	Path   string
	Reason string
	Err    error
}

func (e *LocalFileError) Error() string {
	return fmt.Sprintf("model file %s %s", e.Path, e.Reason)
}

func (e *LocalFileError) Unwrap() error { return e.Err }

// DiskSpaceError is a download that does not fit on the store's file system.
type DiskSpaceError struct {
	Dir        string
	Need, Free uint64
}

func (e *DiskSpaceError) Error() string {
	return fmt.Sprintf("not enough disk space in %s: the download needs %s more, %s free", e.Dir, bytesString(e.Need), bytesString(e.Free))
}

// StalledError is a download whose server stopped sending for too long.
type StalledError struct {
	URL   string
	After string
}

func (e *StalledError) Error() string {
	return fmt.Sprintf("downloading %s: no data received for %s", e.URL, e.After)
}

// IncompleteError is a response body that ended before the size the server announced.
type IncompleteError struct {
	URL       string
	Got, Want int64
}

func (e *IncompleteError) Error() string {
	return fmt.Sprintf("downloading %s: the response ended at %d of %d bytes", e.URL, e.Got, e.Want)
}

// TooLargeError is a download over the store's MaxModelBytes.
type TooLargeError struct {
	URL string
	// Size is the size the server announced, -1 when it did not say (the body went
	// past the cap).
	Size, Max int64
}

func (e *TooLargeError) Error() string {
	if e.Size < 0 {
		return fmt.Sprintf("downloading %s: the file is larger than this Mac's limit of %s (macfleet agent --max-model-bytes)", e.URL, bytesString(uint64(e.Max)))
	}
	return fmt.Sprintf("downloading %s: the file is %s, larger than this Mac's limit of %s (macfleet agent --max-model-bytes)",
		e.URL, bytesString(uint64(e.Size)), bytesString(uint64(e.Max)))
}

// Retryable reports whether fetching again later may succeed. It is false for what
// only a change of the source, the file or the source policy fixes: a checksum
// mismatch, a malformed source or digest, a source or address the policy denies, a
// download over MaxModelBytes, a file that is not GGUF, a missing or unreadable local file, a registry manifest
// without a model, and HTTP answers such as 404, 401 and 403. It is
// true for the rest: unreachable servers, 5xx, 429, cut connections, stalls, a full
// disk, cancellation, and errors it does not know.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	var (
		checksum *ChecksumError
		digest   *DigestError
		format   *FormatError
		local    *LocalFileError
		parse    *modelsource.ParseError
		manifest *modelsource.ManifestError
		status   *modelsource.StatusError
		denied   *sourcepolicy.DeniedError
		tooLarge *TooLargeError
	)
	switch {
	case errors.As(err, &checksum), errors.As(err, &digest), errors.As(err, &format),
		errors.As(err, &local), errors.As(err, &parse), errors.As(err, &manifest), errors.As(err, &denied),
		errors.As(err, &tooLarge):
		return false
	case errors.As(err, &status):
		switch c := status.StatusCode; {
		case c >= 500, c == http.StatusRequestTimeout, c == http.StatusTooEarly, c == http.StatusTooManyRequests:
			return true
		default:
			return false
		}
	}
	return true
}

func bytesString(n uint64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %cB", float64(n)/float64(div), "kMGTPE"[exp])
}
