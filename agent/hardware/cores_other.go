//go:build !darwin

package hardware

// perfLevel0Cores: only macOS tells performance cores apart.
func perfLevel0Cores() int { return 0 }
