//go:build !linux && !darwin

package enginepool

// NewGauge returns the gauge of this operating system. There is none here: only Linux
// (/proc) and macOS are measured.
func NewGauge() (Gauge, error) {
	return nil, &GaugeError{Op: "init", Source: "this platform", Err: ErrGaugeUnsupported}
}
