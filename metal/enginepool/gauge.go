package enginepool

import (
	"errors"
	"fmt"
)

// Errors a Gauge wraps in a *GaugeError; branch on them with errors.Is.
var (
	// ErrProcessNotFound: the process measured by Gauge.Process does not exist (it
	// exited and was reaped, or never existed).
	ErrProcessNotFound = errors.New("process not found")
	// ErrMalformed: the kernel's answer could not be parsed.
	ErrMalformed = errors.New("malformed memory statistics")
	// ErrGaugeUnsupported: there is no memory gauge for this operating system.
	ErrGaugeUnsupported = errors.New("no memory gauge for this operating system")
)

// GaugeError is a failed measurement: what was measured, from which source (a /proc
// file, a sysctl, a kernel call) and why.
type GaugeError struct {
	// Op is "hardware", "host", "process" or "init".
	Op string
	// Source names where the figure was read, e.g. "/proc/meminfo" or "host_statistics64".
	Source string
	Err    error
}

func (e *GaugeError) Error() string {
	return fmt.Sprintf("measuring %s memory from %s: %v", e.Op, e.Source, e.Err)
}

func (e *GaugeError) Unwrap() error { return e.Err }
