package modelsource

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/macfleet/macfleet/test/support/testenv"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    Source
		wantErr string // substring of the *ParseError's message
	}{
		{in: "hf://Qwen/Qwen2.5-7B-Instruct-GGUF/qwen2.5-7b-instruct-q4_k_m.gguf",
			want: Source{Scheme: HuggingFace, Org: "Qwen", Repo: "Qwen2.5-7B-Instruct-GGUF", Path: "qwen2.5-7b-instruct-q4_k_m.gguf", Revision: "main"}},
		{in: "hf://org/repo/sub/dir/model.Q8_0.GGUF@v1.2",
			want: Source{Scheme: HuggingFace, Org: "org", Repo: "repo", Path: "sub/dir/model.Q8_0.GGUF", Revision: "v1.2"}},
		{in: "hf://org/repo/m.gguf@refs/pr/3",
			want: Source{Scheme: HuggingFace, Org: "org", Repo: "repo", Path: "m.gguf", Revision: "refs/pr/3"}},
		{in: "hf://org/repo", wantErr: "want hf://<org>/<repo>/<path/to/file.gguf>"},
		{in: "hf://org/repo/", wantErr: "want hf://<org>/<repo>/<path/to/file.gguf>"},
		{in: "hf://org/repo/model.bin", wantErr: "does not name a .gguf file"},
		{in: "hf://org/repo/big-Q4_K_M-00001-of-00003.gguf",
			want: Source{Scheme: HuggingFace, Org: "org", Repo: "repo", Path: "big-Q4_K_M-00001-of-00003.gguf", Revision: "main", Parts: 3}},
		{in: "hf://org/repo/one-00001-of-00001.gguf",
			want: Source{Scheme: HuggingFace, Org: "org", Repo: "repo", Path: "one-00001-of-00001.gguf", Revision: "main"}},
		{in: "hf://org/repo/Q8_0/big-Q8_0-00002-of-00003.gguf@v1",
			wantErr: `"big-Q8_0-00002-of-00003.gguf" is part 2 of the 3 files of a model: name its first part, hf://org/repo/Q8_0/big-Q8_0-00001-of-00003.gguf@v1`},
		{in: "hf://org/repo/Q8_0/big-Q8_0-00001-of-00002.GGUF@main", wantErr: "lowercase"},
		{in: "hf://org/repo/big-00000-of-00002.gguf", wantErr: "its number must be from 1 to the count"},
		{in: "hf://org/repo/big-00003-of-00002.gguf", wantErr: "its number must be from 1 to the count"},
		{in: "https://models.example/m/big-00001-of-00004.gguf?sig=x",
			want: Source{Scheme: HTTP, URL: "https://models.example/m/big-00001-of-00004.gguf?sig=x", Parts: 4}},
		{in: "https://models.example/m/big-00004-of-00004.gguf?sig=x",
			wantErr: "name its first part, https://models.example/m/big-00001-of-00004.gguf?sig=x"},
		{in: "file:///Volumes/models/big-00001-of-00002.gguf", want: Source{Scheme: File, LocalPath: "/Volumes/models/big-00001-of-00002.gguf", Parts: 2}},
		{in: "file:///Volumes/models/big-00002-of-00002.gguf", wantErr: "name its first part, file:///Volumes/models/big-00001-of-00002.gguf"},
		{in: "hf://org/repo/model-00001-of-00003-merged.gguf",
			want: Source{Scheme: HuggingFace, Org: "org", Repo: "repo", Path: "model-00001-of-00003-merged.gguf", Revision: "main"}},
		{in: "hf://org/repo/a//b.gguf", wantErr: "empty path segment"},
		{in: "hf://org/repo/../b.gguf", wantErr: `segment ".." not allowed`},
		{in: "hf://org/repo/m.gguf@", wantErr: "empty revision"},
		{in: "hf://-org/repo/m.gguf", wantErr: "organisation"},
		{in: "hf://org/re po/m.gguf", wantErr: "repository"},

		{in: "ollama://llama3.2", want: Source{Scheme: Ollama, Namespace: "library", Name: "llama3.2", Tag: "latest"}},
		{in: "ollama://qwen2.5:7b-instruct-q4_K_M", want: Source{Scheme: Ollama, Namespace: "library", Name: "qwen2.5", Tag: "7b-instruct-q4_K_M"}},
		{in: "ollama://team/model:v1", want: Source{Scheme: Ollama, Namespace: "team", Name: "model", Tag: "v1"}},
		{in: "ollama://a/b/c", wantErr: `model name "b/c"`},
		{in: "ollama://model:", wantErr: `tag ""`},
		{in: "ollama:///model", wantErr: `namespace ""`},

		{in: "https://example.com/models/x.gguf", want: Source{Scheme: HTTP, URL: "https://example.com/models/x.gguf"}},
		{in: "http://10.0.0.1:8080/x.gguf?sig=abc", want: Source{Scheme: HTTP, URL: "http://10.0.0.1:8080/x.gguf?sig=abc"}},
		{in: "https:///x.gguf", wantErr: "no host"},
		{in: "https://example.com/", wantErr: "no file path"},

		{in: "file:///Users/me/models/x.gguf", want: Source{Scheme: File, LocalPath: "/Users/me/models/x.gguf"}},
		{in: "file:///Users/me/My%20Models/x.gguf", want: Source{Scheme: File, LocalPath: "/Users/me/My Models/x.gguf"}},
		{in: "file://localhost/opt/x.gguf", want: Source{Scheme: File, LocalPath: "/opt/x.gguf"}},
		{in: "file://mac-1/opt/x.gguf", wantErr: `host "mac-1"`},
		{in: "file:///", wantErr: "absolute file path"},
		{in: "file:///.", wantErr: "absolute file path"},
		{in: "file:///a/..", wantErr: "absolute file path"},

		{in: "s3://bucket/x.gguf", wantErr: `unknown scheme "s3"`},
		{in: "/path/x.gguf", wantErr: "no scheme"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Parse(tt.in)
			if tt.wantErr != "" {
				var pe *ParseError
				if !errors.As(err, &pe) {
					t.Fatalf("Parse(%q) error = %v, want a *ParseError", tt.in, err)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse(%q) error = %q, want it to contain %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.in, err)
			}
			tt.want.Raw = tt.in
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Parse(%q) mismatch (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func TestSourceString(t *testing.T) {
	for in, want := range map[string]string{
		"hf://o/r/a/b.gguf":         "hf://o/r/a/b.gguf@main",
		"ollama://m":                "ollama://library/m:latest",
		"file:///a%20b/c.gguf":      "file:///a%20b/c.gguf",
		"https://h/x.gguf?q=1":      "https://h/x.gguf?q=1",
		"ollama://ns/m:t":           "ollama://ns/m:t",
		"hf://o/r/x.gguf@v2":        "hf://o/r/x.gguf@v2",
		"file://localhost/x/../y.g": "file:///y.g",
	} {
		src, err := Parse(in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", in, err)
		}
		if got := src.String(); got != want {
			t.Errorf("Parse(%q).String() = %q, want %q", in, got, want)
		}
	}
}

// registry is an httptest server playing the Hugging Face hub and the ollama registry.
func registry(t *testing.T) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v2/library/llama3.2/manifests/latest", func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("Accept"); got != ollamaManifestAccept {
			http.Error(w, "bad accept "+got, http.StatusNotAcceptable)
			return
		}
		_, _ = w.Write([]byte(`{"schemaVersion":2,"layers":[
			{"mediaType":"application/vnd.ollama.image.template","digest":"sha256:aaaa","size":10},
			{"mediaType":"application/vnd.ollama.image.model","digest":"sha256:0123abcd","size":2019377376},
			{"mediaType":"application/vnd.ollama.image.license","digest":"sha256:bbbb","size":20}]}`))
	})
	mux.HandleFunc("GET /v2/team/nomodel/manifests/v1", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"layers":[{"mediaType":"application/vnd.ollama.image.template","digest":"sha256:aa"}]}`))
	})
	mux.HandleFunc("GET /v2/team/garbage/manifests/v1", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`<html>`))
	})
	mux.HandleFunc("GET /v2/team/baddigest/manifests/v1", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"layers":[{"mediaType":"application/vnd.ollama.image.model","digest":"../../etc"}]}`))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestResolve(t *testing.T) {
	srv := registry(t)
	r := &Resolver{HFEndpoint: srv.URL + "/hub/", OllamaRegistry: srv.URL, HTTPClient: srv.Client()}
	tests := []struct {
		in   string
		want Location
	}{
		{in: "hf://org/repo/dir/m q.gguf", want: Location{URL: srv.URL + "/hub/org/repo/resolve/main/dir/m%20q.gguf"}},
		{in: "hf://org/repo/m.gguf@refs/pr/3", want: Location{URL: srv.URL + "/hub/org/repo/resolve/refs%2Fpr%2F3/m.gguf"}},
		{in: "ollama://llama3.2", want: Location{URL: srv.URL + "/v2/library/llama3.2/blobs/sha256:0123abcd", Digest: "sha256:0123abcd", Size: 2019377376}},
		{in: "https://cdn.example/x.gguf", want: Location{URL: "https://cdn.example/x.gguf"}},
		{in: "file:///models/x.gguf", want: Location{LocalPath: "/models/x.gguf"}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := r.ResolveString(t.Context(), tt.in)
			if err != nil {
				t.Fatalf("Resolve(%q): %v", tt.in, err)
			}
			tt.want.Source = got.Source
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Resolve(%q) mismatch (-want +got):\n%s", tt.in, diff)
			}
			if got.IsLocal() != (tt.want.LocalPath != "") {
				t.Errorf("IsLocal() = %v", got.IsLocal())
			}
		})
	}
}

func TestPartSources(t *testing.T) {
	for in, want := range map[string][]string{
		"hf://org/repo/Q4/big-Q4-00001-of-00003.gguf@v1": {
			"hf://org/repo/Q4/big-Q4-00001-of-00003.gguf@v1",
			"hf://org/repo/Q4/big-Q4-00002-of-00003.gguf@v1",
			"hf://org/repo/Q4/big-Q4-00003-of-00003.gguf@v1",
		},
		"https://cdn.example/a%20b/m-00001-of-00002.gguf?sig=x": {
			"https://cdn.example/a%20b/m-00001-of-00002.gguf?sig=x",
			"https://cdn.example/a%20b/m-00002-of-00002.gguf?sig=x",
		},
		"file:///models/m-00001-of-00002.gguf": {"file:///models/m-00001-of-00002.gguf", "file:///models/m-00002-of-00002.gguf"},
		"hf://org/repo/one.gguf":               {"hf://org/repo/one.gguf"},
	} {
		src, err := Parse(in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", in, err)
		}
		var got []string
		for i, p := range src.PartSources() {
			got = append(got, p.Raw)
			if p.Raw != p.String() && !strings.HasPrefix(in, "hf://") {
				t.Errorf("%q part %d: Raw %q, String %q", in, i+1, p.Raw, p.String())
			}
			if i > 0 && p.Parts != 0 {
				t.Errorf("%q part %d has Parts %d, want 0 (it names one file)", in, i+1, p.Parts)
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("PartSources of %q (-want +got):\n%s", in, diff)
		}
	}
}

func TestResolveParts(t *testing.T) {
	r := &Resolver{HFEndpoint: "http://hub.test"}
	loc, err := r.ResolveString(t.Context(), "hf://org/repo/m-00001-of-00002.gguf")
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for _, p := range loc.Parts {
		urls = append(urls, p.URL)
		if p.Parts != nil {
			t.Errorf("part %s has parts of its own", p.URL)
		}
	}
	want := []string{"http://hub.test/org/repo/resolve/main/m-00001-of-00002.gguf", "http://hub.test/org/repo/resolve/main/m-00002-of-00002.gguf"}
	if diff := cmp.Diff(want, urls); diff != "" || loc.URL != want[0] {
		t.Errorf("Resolve of a first part: URL %s, parts (-want +got):\n%s", loc.URL, diff)
	}
	one, err := r.ResolveString(t.Context(), "hf://org/repo/m.gguf")
	if err != nil || one.Parts != nil {
		t.Errorf("Resolve of one file: parts %v, %v; want none", one.Parts, err)
	}
}

func TestResolveDefaults(t *testing.T) {
	var r Resolver
	src, _ := Parse("hf://o/r/x.gguf")
	if got, want := r.HFURL(src), "https://huggingface.co/o/r/resolve/main/x.gguf"; got != want {
		t.Errorf("HFURL = %q, want %q", got, want)
	}
	src, _ = Parse("ollama://qwen2.5:7b")
	if got, want := r.OllamaManifestURL(src), "https://registry.ollama.ai/v2/library/qwen2.5/manifests/7b"; got != want {
		t.Errorf("OllamaManifestURL = %q, want %q", got, want)
	}
}

func TestResolveErrors(t *testing.T) {
	srv := registry(t)
	// A reserved port refuses connections for the whole test.
	dead := "http://" + testenv.ReservePort(t).Addr

	tests := []struct {
		name     string
		registry string
		in       string
		check    func(error) bool
		wantMsg  string
	}{
		{"manifest 404", srv.URL, "ollama://nosuch:v1", func(err error) bool {
			var se *StatusError
			return errors.As(err, &se) && se.NotFound() && se.StatusCode == 404
		}, "404"},
		{"no model layer", srv.URL, "ollama://team/nomodel:v1", func(err error) bool {
			var me *ManifestError
			return errors.As(err, &me)
		}, "no layer of media type application/vnd.ollama.image.model"},
		{"not JSON", srv.URL, "ollama://team/garbage:v1", func(err error) bool {
			var me *ManifestError
			return errors.As(err, &me)
		}, "not JSON"},
		{"malformed digest", srv.URL, "ollama://team/baddigest:v1", func(err error) bool {
			var me *ManifestError
			return errors.As(err, &me)
		}, "malformed digest"},
		{"unreachable", dead, "ollama://llama3.2", func(err error) bool {
			var ue *UnreachableError
			return errors.As(err, &ue)
		}, "unreachable"},
		{"bad syntax", srv.URL, "ollama://a b", func(err error) bool {
			var pe *ParseError
			return errors.As(err, &pe)
		}, "invalid model source"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Resolver{OllamaRegistry: tt.registry}
			_, err := r.ResolveString(t.Context(), tt.in)
			if err == nil || !tt.check(err) {
				t.Fatalf("Resolve(%q) error = %#v (%v), wrong type", tt.in, err, err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not mention %q", err, tt.wantMsg)
			}
		})
	}

	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		r := &Resolver{OllamaRegistry: srv.URL}
		_, err := r.ResolveString(ctx, "ollama://llama3.2")
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error = %v, want context.Canceled", err)
		}
	})
}
