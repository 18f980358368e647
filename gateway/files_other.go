//go:build !unix

package gateway

import "os"

func sysIno(os.FileInfo) (uint64, bool) { return 0, false }
