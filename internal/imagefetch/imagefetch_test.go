package imagefetch

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPlan(t *testing.T) {
	msg := func(parts string) string {
		return `{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"user","content":[` + parts + `]}]}`
	}
	img := func(url string) string { return `{"type":"image_url","image_url":{"url":"` + url + `"}}` }
	for _, tc := range []struct {
		name, body string
		max        int
		want       []Ref
		errParam   string
	}{
		{name: "text only", body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, max: 4},
		{name: "data URI kept", body: msg(img("data:image/png;base64,AAAA")), max: 4},
		{name: "https and http fetched, in order", body: msg(`{"type":"text","text":"a"},` + img("https://a.example/1.png") + `,` + img("HTTP://b.example/2.png")), max: 4,
			want: []Ref{{1, 1, "https://a.example/1.png"}, {1, 2, "HTTP://b.example/2.png"}}},
		{name: "another scheme", body: msg(img("file:///etc/passwd")), max: 4, errParam: "messages[1].content[0].image_url.url"},
		{name: "no scheme", body: msg(img("cat.png")), max: 4, errParam: "messages[1].content[0].image_url.url"},
		{name: "too many", body: msg(img("https://a/1.png") + `,` + img("https://a/2.png") + `,` + img("https://a/3.png")), max: 2,
			errParam: "messages[1].content[2].image_url.url"},
		{name: "not JSON: the server answers it", body: `{"messages":[image_url`, max: 4},
	} {
		got, err := Plan([]byte(tc.body), tc.max)
		var e *Error
		switch {
		case tc.errParam != "" && (!errors.As(err, &e) || e.Param != tc.errParam):
			t.Errorf("%s: error %v, want one naming %s", tc.name, err, tc.errParam)
		case tc.errParam == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

func TestCheckResponse(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
	for _, tc := range []struct {
		name string
		r    Response
		want string
		says string
	}{
		{name: "png", r: Response{Status: 200, ContentType: "image/png", Length: 100, Head: png}, want: "image/png"},
		{name: "jpeg with parameters", r: Response{Status: 200, ContentType: "Image/JPEG; charset=binary", Length: -1, Head: []byte{0xff, 0xd8, 0xff}}, want: "image/jpeg"},
		{name: "octet-stream sniffed", r: Response{Status: 200, ContentType: "application/octet-stream", Length: -1, Head: png}, want: "image/png"},
		{name: "no type sniffed", r: Response{Status: 200, Length: -1, Head: png}, want: "image/png"},
		{name: "html", r: Response{Status: 200, ContentType: "text/html", Length: 10, Head: png}, says: `Content-Type is "text/html"`},
		{name: "svg", r: Response{Status: 200, ContentType: "image/svg+xml", Length: 10, Head: []byte("<svg")}, says: "image/svg+xml"},
		{name: "octet-stream not an image", r: Response{Status: 200, ContentType: "application/octet-stream", Length: 10, Head: []byte("GGUF\x03")}, says: "not an image"},
		{name: "not found", r: Response{Status: 404, ContentType: "text/plain"}, says: "HTTP 404"},
		{name: "too large by its length", r: Response{Status: 200, ContentType: "image/png", Length: 2 << 20, Head: png}, says: "larger than 1 MiB"},
	} {
		got, err := CheckResponse(tc.r, 1<<20)
		switch {
		case tc.says != "" && (err == nil || !strings.Contains(err.Error(), tc.says)):
			t.Errorf("%s: %q, %v; want an error saying %q", tc.name, got, err, tc.says)
		case tc.says == "" && (err != nil || got != tc.want):
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}
