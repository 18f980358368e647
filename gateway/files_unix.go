//go:build unix

package gateway

import (
	"os"
	"syscall"
)

func sysIno(fi os.FileInfo) (uint64, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return uint64(st.Ino), true //nolint:unconvert // uint64 on linux, not everywhere
}
