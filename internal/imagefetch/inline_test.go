package imagefetch_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/imagefetch"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// pngBytes is a real 8×8 PNG.
func pngBytes(t *testing.T) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, 8, 8))
	for i := range 8 {
		img.Set(i, i, color.RGBA{R: 200, A: 255})
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// imageHost is an https server of images and a policy that lets namespace "team"
// fetch from it (its loopback address allowed, its host listed), and an inliner
// under that policy.
type imageHost struct {
	srv     *httptest.Server
	hits    atomic.Int32
	inliner *imagefetch.Inliner
}

func newImageHost(t *testing.T, rules []v1alpha1.SourcePolicyRule, handler http.HandlerFunc) *imageHost {
	t.Helper()
	h := &imageHost{}
	h.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.hits.Add(1)
		handler(w, r)
	}))
	t.Cleanup(h.srv.Close)
	p, err := sourcepolicy.Compile(&v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: v1alpha1.SourcePolicySpec{AllowedNetworks: []string{"127.0.0.0/8"}, Rules: rules}})
	if err != nil {
		t.Fatal(err)
	}
	holder := sourcepolicy.NewHolder(p)
	h.inliner = &imagefetch.Inliner{Client: holder.Client(h.srv.Client()), MaxBytes: 4096,
		Admit: func(ctx context.Context, u string) (context.Context, error) {
			if err := holder.Policy().DecideSource("team", u).Err("team", u); err != nil {
				return ctx, err
			}
			return sourcepolicy.ForSource(ctx, "team", u), nil
		}}
	return h
}

func hostRule() []v1alpha1.SourcePolicyRule {
	return []v1alpha1.SourcePolicyRule{{Namespaces: []string{"team"}, Hosts: []string{"127.0.0.1"}}}
}

func chatBody(urls ...string) []byte {
	parts := []any{map[string]any{"type": "text", "text": "What is this?"}}
	for _, u := range urls {
		parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": u, "detail": "low"}})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 3,
		"messages": []any{map[string]any{"role": "system", "content": "Be brief."}, map[string]any{"role": "user", "content": parts}}})
	return b
}

func TestInlineFetchesImages(t *testing.T) {
	pic := pngBytes(t)
	h := newImageHost(t, hostRule(), func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "image/png")
		_, _ = w.Write(pic)
	})
	data := "data:image/gif;base64,R0lGODlhAQABAAAAACw="
	out, err := h.inliner.Inline(context.Background(), chatBody(h.srv.URL+"/a.png", data, h.srv.URL+"/a.png"))
	if err != nil {
		t.Fatal(err)
	}
	var req struct {
		Model    string
		Messages []struct {
			Role    string
			Content json.RawMessage
		}
	}
	if err := json.Unmarshal(out, &req); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	var parts []struct {
		Type     string
		Text     string
		ImageURL struct{ URL, Detail string } `json:"image_url"`
	}
	if err := json.Unmarshal(req.Messages[1].Content, &parts); err != nil || len(parts) != 4 {
		t.Fatalf("content %s: %v", req.Messages[1].Content, err)
	}
	want := "data:image/png;base64," + base64.StdEncoding.EncodeToString(pic)
	if parts[0].Text != "What is this?" || parts[1].ImageURL.URL != want || parts[2].ImageURL.URL != data || parts[3].ImageURL.URL != want ||
		parts[1].ImageURL.Detail != "low" || req.Model != "m" || string(req.Messages[0].Content) != `"Be brief."` {
		t.Errorf("inlined request %s", out)
	}
	if n := h.hits.Load(); n != 1 {
		t.Errorf("the image was fetched %d times, want once (the same URL twice in a request)", n)
	}
	// A request without an image URL comes back byte for byte.
	plain := chatBody(data)
	if got, err := h.inliner.Inline(context.Background(), plain); err != nil || !bytes.Equal(got, plain) {
		t.Errorf("a request with only data URIs became %s, %v", got, err)
	}
}

func TestInlineRefuses(t *testing.T) {
	pic := pngBytes(t)
	serve := func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/page.html":
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte("<html>not an image</html>"))
		case "/big.png":
			w.Header().Set("Content-Type", "image/png")
			_, _ = w.Write(append(pic, make([]byte, 5000)...))
		case "/big-chunked.png":
			w.Header().Set("Content-Type", "image/png")
			for range 5 {
				_, _ = w.Write(make([]byte, 1000))
				http.NewResponseController(w).Flush()
			}
		case "/away":
			http.Redirect(w, r, "https://elsewhere.example/a.png", http.StatusFound)
		case "/down":
			u := *r.URL
			u.Scheme, u.Host, u.Path = "http", r.Host, "/a.png"
			http.Redirect(w, r, u.String(), http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}
	h := newImageHost(t, hostRule(), serve)
	plain := strings.Replace(h.srv.URL, "https://", "http://", 1)
	for _, tc := range []struct{ name, url, says string }{
		{"not an image", h.srv.URL + "/page.html", `Content-Type is "text/html"`},
		{"over the cap by its length", h.srv.URL + "/big.png", "larger than"},
		{"over the cap streamed", h.srv.URL + "/big-chunked.png", "larger than"},
		{"not found", h.srv.URL + "/nothing.png", "HTTP 404"},
		{"plain http", plain + "/a.png", "plain http://"},
		{"a redirect to a host not listed", h.srv.URL + "/away", `source host "elsewhere.example" is not allowed`},
		{"a redirect down to http", h.srv.URL + "/down", "from https:// to plain http://"},
		{"a host not listed", "https://localhost:1/a.png", `source host "localhost" is not allowed for namespace "team"`},
	} {
		_, err := h.inliner.Inline(context.Background(), chatBody(tc.url))
		var e *imagefetch.Error
		if !errors.As(err, &e) || e.Param != "messages[1].content[1].image_url.url" || !strings.Contains(e.Message, tc.says) {
			t.Errorf("%s: %v, want an *Error naming the part and saying %q", tc.name, err, tc.says)
		}
	}
}

// TestInlineChecksTheAddress: a host the rules list whose address is loopback is
// refused when the policy does not allow loopback (the built-in denial).
func TestInlineChecksTheAddress(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the loopback server was reached")
	}))
	t.Cleanup(srv.Close)
	p, err := sourcepolicy.Compile(&v1alpha1.SourcePolicy{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		Spec: v1alpha1.SourcePolicySpec{Rules: hostRule()}})
	if err != nil {
		t.Fatal(err)
	}
	holder := sourcepolicy.NewHolder(p)
	in := &imagefetch.Inliner{Client: holder.Client(srv.Client()), Admit: func(ctx context.Context, u string) (context.Context, error) {
		return ctx, holder.Policy().DecideSource("team", u).Err("team", u)
	}}
	u, _ := url.Parse(srv.URL)
	_, err = in.Inline(context.Background(), chatBody("https://"+u.Host+"/a.png"))
	var e *imagefetch.Error
	if !errors.As(err, &e) || !strings.Contains(e.Message, "loopback") {
		t.Errorf("%v, want a refusal naming loopback", err)
	}
}
