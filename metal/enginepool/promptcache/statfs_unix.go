//go:build unix

package promptcache

import "golang.org/x/sys/unix"

// FreeBytes is the space available to an unprivileged user on the file system
// holding path (statfs f_bavail × f_bsize). It is the default SSDConfig.Statfs.
func FreeBytes(path string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil //nolint:unconvert // Bsize differs by OS
}
