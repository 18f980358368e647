package hubdouble

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestDirGatedAndRanges: a file under dir/org/repo is served at its resolve URL of any
// revision, with ranges; a gated repository answers 401 without its token and a
// wrong one, the other repositories stay open; every request is recorded.
func TestDirGatedAndRanges(t *testing.T) {
	dir := t.TempDir()
	for _, repo := range []string{"org/open", "org/gated"} {
		if err := os.MkdirAll(filepath.Join(dir, repo, "Q"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, repo, "Q", "m.gguf"), []byte("GGUF and the rest"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := New(Dir(dir))
	defer h.Close()
	h.Gate("/org/gated/", "hf_right")
	get := func(path, token, rng string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, h.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if rng != "" {
			req.Header.Set("Range", rng)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		path, token, rng string
		code             int
		body             string
	}{
		{"/org/open/resolve/main/Q/m.gguf", "", "", 200, "GGUF and the rest"},
		{"/org/open/resolve/v2/Q/m.gguf", "", "bytes=0-3", 206, "GGUF"},
		{"/org/open/resolve/main/Q/none.gguf", "", "", 404, ""},
		{"/org/open/tree/main/Q/m.gguf", "", "", 404, ""},
		{"/org/gated/resolve/main/Q/m.gguf", "", "", 401, ""},
		{"/org/gated/resolve/main/Q/m.gguf", "hf_wrong", "", 401, ""},
		{"/org/gated/resolve/main/Q/m.gguf", "hf_right", "bytes=5-", 206, "and the rest"},
	} {
		code, body := get(tc.path, tc.token, tc.rng)
		if code != tc.code || (tc.body != "" && body != tc.body) {
			t.Errorf("GET %s (token %q, range %q): %d %q, want %d %q", tc.path, tc.token, tc.rng, code, body, tc.code, tc.body)
		}
	}
	if got := h.Requests(); len(got) != 7 || !slices.Contains(got, "GET /org/gated/resolve/main/Q/m.gguf Bearer hf_right") {
		t.Errorf("requests recorded: %q", got)
	}
}
