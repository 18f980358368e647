package lib

import (
	"testing"

	"example.com/mod/controllers/ctl"
)

// A test file's import is not counted.
func TestLimit(t *testing.T) { _ = ctl.Name }
