//go:build !linux && !darwin

package runnerproc

import "errors"

var errNoProcWatch = errors.New("adopting runners is supported on Linux and darwin only")

func openProc(int) (procHandle, error) { return nil, errNoProcWatch }

func procStartTime(int) (uint64, error) { return 0, errNoProcWatch }
