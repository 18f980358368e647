//go:build !unix

package promptcache

import "errors"

// FreeBytes is not implemented on this OS: the quota is then the configured one.
func FreeBytes(string) (int64, error) {
	return 0, errors.New("free disk space: not supported on this OS")
}
