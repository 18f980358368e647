package store

import (
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

func policyHolder(t *testing.T, spec v1alpha1.SourcePolicySpec) *sourcepolicy.Holder {
	t.Helper()
	p, err := sourcepolicy.Compile(&v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	return sourcepolicy.NewHolder(p)
}

func wantDenied(t *testing.T, err error, want ...string) {
	t.Helper()
	var de *sourcepolicy.DeniedError
	if !errors.As(err, &de) {
		t.Fatalf("Fetch: %v, want a *sourcepolicy.DeniedError", err)
	}
	if Retryable(err) {
		t.Errorf("a denial is retryable: %v", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not contain %q", err.Error(), w)
		}
	}
}

// The downloader refuses to connect to loopback even when the source names a host
// the policy lists, because the name resolves there; allowing loopback explicitly
// lets the same download through.
func TestFetchChecksTheResolvedAddress(t *testing.T) {
	content := model(64<<10, 31)
	o := newOrigin(t, content)
	_, port, _ := net.SplitHostPort(o.Listener.Addr().String())
	rules := []v1alpha1.SourcePolicyRule{{Namespaces: []string{testNS}, Hosts: []string{"localhost"}, AllowPlainHTTP: true,
		Registries: []v1alpha1.SourceRegistry{v1alpha1.RegistryHF}}}
	h := policyHolder(t, v1alpha1.SourcePolicySpec{Rules: rules})
	s := newStore(t, t.TempDir(), o, func(opts *Options) { opts.Policy = h })

	src := "http://localhost:" + port + "/m.gguf"
	_, err := s.Fetch(t.Context(), testNS, src, sum(content), nil)
	wantDenied(t, err, "downloading "+src, "is loopback, which model fetches may not connect to", "spec.allowedNetworks")
	// hf:// resolves to the hub endpoint, here the loopback origin: refused as well.
	_, err = s.Fetch(t.Context(), testNS, "hf://org/repo/m.gguf", sum(content), nil)
	wantDenied(t, err, "is loopback")
	if got := o.requests(); len(got) != 0 {
		t.Fatalf("the origin saw %d requests, want none: %+v", len(got), got)
	}

	h.Set(policyHolder(t, v1alpha1.SourcePolicySpec{Rules: rules, AllowedNetworks: []string{"127.0.0.0/8", "::1/128"}}).Policy())
	p, err := s.Fetch(t.Context(), testNS, src, sum(content), nil)
	if err != nil {
		t.Fatalf("Fetch with loopback allowed: %v", err)
	}
	if b, _ := os.ReadFile(p); string(b) != string(content) {
		t.Fatal("the stored file differs from the origin's")
	}
}

// A redirect is a new connection: its address is checked like the first, even when
// the policy lists the host.
func TestFetchRefusesARedirectToLinkLocal(t *testing.T) {
	o := newOrigin(t, nil)
	o.handle = func(w http.ResponseWriter, r *http.Request, _ int) {
		http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/m.gguf", http.StatusFound)
	}
	h := policyHolder(t, v1alpha1.SourcePolicySpec{
		Rules: []v1alpha1.SourcePolicyRule{{Namespaces: []string{testNS}, Hosts: []string{"127.0.0.1", "169.254.169.254"},
			AllowPlainHTTP: true}},
		AllowedNetworks: []string{"127.0.0.0/8", "::1/128"}})
	s := newStore(t, t.TempDir(), o, func(opts *Options) { opts.Policy = h })
	_, err := s.Fetch(t.Context(), testNS, o.URL+"/m.gguf", "", nil)
	wantDenied(t, err, "address 169.254.169.254 is link-local")
}

func TestFetchRefusesSourcesTheNamespaceMayNotUse(t *testing.T) {
	s := newStore(t, t.TempDir(), nil, noNetwork(t))
	for _, tc := range []struct {
		ns, src string
		want    string
	}{
		{testNS, "https://models.example.com/m.gguf", `source host "models.example.com" is not allowed for namespace "team-test": add it to spec.rules[].hosts`},
		{"team-other", "http://127.0.0.1:1/m.gguf", `source host "127.0.0.1" is not allowed for namespace "team-other"`},
		{"team-other", "hf://org/repo/m.gguf", `hf:// sources are not allowed for namespace "team-other"`},
		{"team-other", "file:///etc/passwd", `file /etc/passwd is not under a directory allowed for namespace "team-other"`},
	} {
		_, err := s.Fetch(t.Context(), tc.ns, tc.src, "", nil)
		wantDenied(t, err, tc.want)
	}
}

// file:// sources must lie below an allowed directory after symbolic links are
// resolved, and no error carries the file's bytes.
func TestFetchLocalFilePolicy(t *testing.T) {
	root := t.TempDir()
	allowed, other := filepath.Join(root, "allowed"), filepath.Join(root, "other")
	for _, d := range []string{allowed, other} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	content := model(4096, 32)
	write := func(p string, b []byte) string {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	inside := write(filepath.Join(allowed, "m.gguf"), content)
	secret := write(filepath.Join(other, "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"))
	notModel := write(filepath.Join(allowed, "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"))
	escape := filepath.Join(allowed, "escape.gguf")
	if err := os.Symlink(secret, escape); err != nil {
		t.Fatal(err)
	}
	alias := filepath.Join(allowed, "alias.gguf")
	if err := os.Symlink(inside, alias); err != nil {
		t.Fatal(err)
	}
	h := policyHolder(t, v1alpha1.SourcePolicySpec{Rules: []v1alpha1.SourcePolicyRule{
		{Namespaces: []string{testNS}, FileDirectories: []string{allowed}}}})
	s := newStore(t, t.TempDir(), nil, noNetwork(t), func(o *Options) { o.Policy = h })

	p, err := s.Fetch(t.Context(), testNS, "file://"+inside, sum(content), nil)
	if err != nil || p != inside {
		t.Fatalf("Fetch of an allowed file = %q, %v", p, err)
	}
	p, err = s.Fetch(t.Context(), testNS, "file://"+alias, sum(content), nil)
	if err != nil || p != inside {
		t.Fatalf("Fetch of a link to an allowed file = %q, %v; want the file it links to", p, err)
	}
	_, err = s.Fetch(t.Context(), testNS, "file://"+secret, "", nil)
	wantDenied(t, err, "file "+secret+" is not under a directory allowed for namespace")
	_, err = s.Fetch(t.Context(), testNS, "file://"+escape, "", nil)
	wantDenied(t, err, "file "+escape+" (a link to "+secret+") is not under a directory allowed", "spec.rules[].fileDirectories")
	_, err = s.Fetch(t.Context(), testNS, "file://"+allowed+"/../other/passwd", "", nil)
	wantDenied(t, err, "must name a plain absolute path")

	_, err = s.Fetch(t.Context(), testNS, "file://"+notModel, "", nil)
	var fe *FormatError
	if !errors.As(err, &fe) {
		t.Fatalf("Fetch of a file that is not GGUF: %v, want a *FormatError", err)
	}
	if strings.Contains(err.Error(), "root") {
		t.Errorf("the error echoes the file's content: %q", err.Error())
	}
}

func TestMaxModelBytes(t *testing.T) {
	content := model(64<<10, 33)
	o := newOrigin(t, content)
	chunked := newOrigin(t, nil)
	chunked.handle = func(w http.ResponseWriter, r *http.Request, _ int) {
		// No Content-Length: the size shows only as the body arrives.
		for off := 0; off < len(content); off += 4096 {
			_, _ = w.Write(content[off : off+4096])
			w.(http.Flusher).Flush()
		}
	}
	for _, tc := range []struct {
		name, src string
		max       int64
		want      string
	}{
		{"announced", o.URL + "/m.gguf", 32 << 10, "the file is 65.5 kB, larger than this Mac's limit of 32.8 kB (macfleet agent --max-model-bytes)"},
		{"unannounced", chunked.URL + "/m.gguf", 32 << 10, "the file is larger than this Mac's limit of 32.8 kB"},
		{"under the cap", o.URL + "/m.gguf", 64 << 10, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t, t.TempDir(), nil, func(opts *Options) { opts.MaxModelBytes = tc.max })
			p, err := s.Fetch(t.Context(), testNS, tc.src, "", nil)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Fetch under the cap: %v", err)
				}
				if b, _ := os.ReadFile(p); string(b) != string(content) {
					t.Fatal("stored file differs")
				}
				return
			}
			var tl *TooLargeError
			if !errors.As(err, &tl) || !strings.Contains(err.Error(), tc.want) || Retryable(err) {
				t.Fatalf("Fetch = %q, %v; want a non-retryable *TooLargeError containing %q", p, err, tc.want)
			}
			if got := files(t, filepath.Join(s.Dir(), "blobs")); len(got) != 0 {
				t.Errorf("the store kept %v after refusing the download", got)
			}
		})
	}
}

// The Mac's own --allow-file-dir list narrows what the cluster's policy allows.
func TestLocalFileDirs(t *testing.T) {
	root := t.TempDir()
	mine, shared := filepath.Join(root, "mine"), filepath.Join(root, "shared")
	content := model(4096, 34)
	for _, d := range []string{mine, shared} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "m.gguf"), content, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h := policyHolder(t, v1alpha1.SourcePolicySpec{Rules: []v1alpha1.SourcePolicyRule{
		{Namespaces: []string{testNS}, FileDirectories: []string{root}}}})
	s := newStore(t, t.TempDir(), nil, noNetwork(t), func(o *Options) { o.Policy, o.LocalFileDirs = h, []string{mine} })
	if _, err := s.Fetch(t.Context(), testNS, "file://"+filepath.Join(mine, "m.gguf"), sum(content), nil); err != nil {
		t.Fatalf("a file both allow: %v", err)
	}
	_, err := s.Fetch(t.Context(), testNS, "file://"+filepath.Join(shared, "m.gguf"), sum(content), nil)
	wantDenied(t, err, "file "+filepath.Join(shared, "m.gguf")+" is not under a directory this Mac allows: the Mac's agent opens files only under its --allow-file-dir directories")
}

// A redirect of an http(s) source must stay on hosts the namespace may use.
func TestFetchRefusesARedirectToAnUnlistedHost(t *testing.T) {
	content := model(4096, 35)
	o := newOrigin(t, content)
	_, port, _ := net.SplitHostPort(o.Listener.Addr().String())
	o.handle = func(w http.ResponseWriter, r *http.Request, _ int) {
		if r.URL.Path == "/m.gguf" {
			http.Redirect(w, r, "http://localhost:"+port+"/elsewhere.gguf", http.StatusFound)
			return
		}
		_, _ = w.Write(content)
	}
	h := policyHolder(t, v1alpha1.SourcePolicySpec{
		Rules:           []v1alpha1.SourcePolicyRule{{Namespaces: []string{testNS}, Hosts: []string{"127.0.0.1"}, AllowPlainHTTP: true}},
		AllowedNetworks: []string{"127.0.0.0/8", "::1/128"}})
	s := newStore(t, t.TempDir(), o, func(opts *Options) { opts.Policy = h })
	_, err := s.Fetch(t.Context(), testNS, o.URL+"/m.gguf", "", nil)
	wantDenied(t, err, "redirects to http://localhost:"+port+`/elsewhere.gguf: source host "localhost" is not allowed for namespace "team-test"`)
}
