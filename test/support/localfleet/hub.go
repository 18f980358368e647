package localfleet

import (
	"os"
	"path/filepath"

	"github.com/macfleet/macfleet/test/support/hubdouble"
)

// startHub starts the fleet's model hub double (Options.Hub): the manager and every
// agent resolve hf://org/repo/path against it (--hf-endpoint), to the files under
// HubDir/org/repo/path.
func (f *Fleet) startHub() error {
	if !f.opts.Hub {
		return nil
	}
	f.HubDir = filepath.Join(f.opts.Dir, "hub")
	if err := os.MkdirAll(f.HubDir, 0o755); err != nil {
		return err
	}
	f.Hub = hubdouble.New(hubdouble.Dir(f.HubDir))
	f.logf("Model hub double on %s, serving %s", f.Hub.URL, f.HubDir)
	return nil
}

// hubArgs are the arguments that point a manager or an agent at the hub double.
func (f *Fleet) hubArgs() []string {
	if f.Hub == nil {
		return nil
	}
	return []string{"--hf-endpoint", f.Hub.URL}
}
