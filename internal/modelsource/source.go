// Package modelsource parses the model sources a ModelDeployment names and resolves them to
// something a reader can open: an HTTP(S) URL, or a path on the local disk.
//
//	hf://<org>/<repo>/<path/file.gguf>[@revision]  → <hf endpoint>/<org>/<repo>/resolve/<revision|main>/<path>
//	ollama://[<namespace>/]<name>[:<tag>]           → <registry>/v2/<ns|library>/<name>/blobs/<digest of the model layer>
//	http(s)://…                                     → itself
//	file:///absolute/path                           → the path
//
// Parse only checks the syntax. Resolve may use the network: an ollama:// source needs
// the registry's manifest to learn which blob holds the model. The controller uses
// this to read a GGUF header for its memory estimate, the node agent to download.
package modelsource

import (
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"
)

// Scheme is the kind of a model source.
type Scheme string

const (
	// HuggingFace is hf://<org>/<repo>/<path/file.gguf>[@revision].
	HuggingFace Scheme = "hf"
	// Ollama is ollama://[<namespace>/]<name>[:<tag>].
	Ollama Scheme = "ollama"
	// HTTP is an http:// or https:// URL, used as is.
	HTTP Scheme = "http"
	// File is file:///absolute/path on the machine that reads it.
	File Scheme = "file"
)

// Defaults for a Resolver whose fields are empty.
const (
	DefaultHFEndpoint     = "https://huggingface.co"
	DefaultOllamaRegistry = "https://registry.ollama.ai"
	// DefaultHFRevision is the revision an hf:// source without @revision resolves to.
	DefaultHFRevision = "main"
	// DefaultOllamaTag is the tag an ollama:// source without :tag resolves to.
	DefaultOllamaTag = "latest"
	// DefaultOllamaNamespace holds the models named without a namespace.
	DefaultOllamaNamespace = "library"
)

// Source is a parsed model source. Which fields are set depends on Scheme.
type Source struct {
	// Raw is the string it was parsed from.
	Raw    string
	Scheme Scheme

	// hf://: Org, Repo, Path (slash-separated, inside the repository) and Revision
	// (DefaultHFRevision when not given).
	Org, Repo, Path, Revision string

	// ollama://: Namespace (DefaultOllamaNamespace when not given), Name and Tag
	// (DefaultOllamaTag when not given).
	Namespace, Name, Tag string

	// http(s)://: URL is the source itself.
	URL string

	// file://: LocalPath is the absolute, unescaped path.
	LocalPath string
}

// ParseError says why a source string is not a valid model source.
type ParseError struct {
	Source string
	Reason string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("invalid model source %q: %s", e.Source, e.Reason)
}

func parseErr(src, format string, args ...any) error {
	return &ParseError{Source: src, Reason: fmt.Sprintf(format, args...)}
}

var (
	// hfName is a Hugging Face organisation or repository name.
	hfName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
	// ollamaName is an ollama namespace, model name or tag.
	ollamaName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)
)

// splitPart is the name llama.cpp gives each part of a model split across files.
var splitPart = regexp.MustCompile(`(?i)-[0-9]{5}-of-[0-9]{5}\.gguf$`)

// SplitPartMessage says why a part of a multi-part GGUF is refused, and what to do.
const SplitPartMessage = "a part of a multi-part GGUF (NAME-00001-of-0000N.gguf) is not supported: " +
	"its memory estimate would count one part and the runner reads one file; merge the parts into one file " +
	"(llama.cpp's gguf-split --merge) and name that"

// IsSplitPart says whether the file name is a part of a multi-part GGUF.
func IsSplitPart(name string) bool { return splitPart.MatchString(name) }

// Parse checks the syntax of a model source and splits it into its parts. It does not
// touch the network. Errors are *ParseError; a part of a multi-part GGUF is refused
// (SplitPartMessage).
func Parse(s string) (Source, error) {
	src, err := parse(s)
	if err != nil {
		return Source{}, err
	}
	name := src.Path + src.LocalPath
	if src.Scheme == HTTP {
		if u, err := url.Parse(src.URL); err == nil {
			name = u.Path
		}
	}
	if IsSplitPart(name) {
		return Source{}, parseErr(s, "%s", SplitPartMessage)
	}
	return src, nil
}

func parse(s string) (Source, error) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return Source{}, parseErr(s, "no scheme: want hf://, ollama://, http://, https:// or file://")
	}
	switch strings.ToLower(scheme) {
	case "hf":
		return parseHF(s, rest)
	case "ollama":
		return parseOllama(s, rest)
	case "http", "https":
		return parseHTTP(s)
	case "file":
		return parseFile(s)
	}
	return Source{}, parseErr(s, "unknown scheme %q: want hf, ollama, http, https or file", scheme)
}

func parseHF(raw, rest string) (Source, error) {
	rev := DefaultHFRevision
	// The revision follows the last '@' after the repository; '@' cannot appear in an
	// organisation or repository name.
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rev = rest[i+1:]
		rest = rest[:i]
		if rev == "" {
			return Source{}, parseErr(raw, "empty revision after '@'")
		}
	}
	parts := strings.SplitN(rest, "/", 3)
	if len(parts) < 3 || parts[2] == "" {
		return Source{}, parseErr(raw, "want hf://<org>/<repo>/<path/to/file.gguf>[@revision]")
	}
	org, repo, p := parts[0], parts[1], parts[2]
	for _, n := range []struct{ what, v string }{{"organisation", org}, {"repository", repo}} {
		if !hfName.MatchString(n.v) {
			return Source{}, parseErr(raw, "%s %q must be letters, digits, '.', '_' or '-'", n.what, n.v)
		}
	}
	if err := checkRelPath(p); err != nil {
		return Source{}, parseErr(raw, "file path %q: %v", p, err)
	}
	if !strings.HasSuffix(strings.ToLower(p), ".gguf") {
		return Source{}, parseErr(raw, "file path %q does not name a .gguf file", p)
	}
	return Source{Raw: raw, Scheme: HuggingFace, Org: org, Repo: repo, Path: p, Revision: rev}, nil
}

// checkRelPath rejects empty, absolute and parent-escaping slash paths.
func checkRelPath(p string) error {
	for seg := range strings.SplitSeq(p, "/") {
		switch seg {
		case "":
			return fmt.Errorf("empty path segment")
		case ".", "..":
			return fmt.Errorf("segment %q not allowed", seg)
		}
	}
	return nil
}

func parseOllama(raw, rest string) (Source, error) {
	ns, nameTag := DefaultOllamaNamespace, rest
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		ns, nameTag = rest[:i], rest[i+1:]
	}
	name, tag, hasTag := strings.Cut(nameTag, ":")
	if !hasTag {
		tag = DefaultOllamaTag
	}
	for _, n := range []struct{ what, v string }{{"namespace", ns}, {"model name", name}, {"tag", tag}} {
		if !ollamaName.MatchString(n.v) {
			return Source{}, parseErr(raw, "%s %q must be letters, digits, '.', '_' or '-' (want ollama://[<namespace>/]<name>[:<tag>])", n.what, n.v)
		}
	}
	return Source{Raw: raw, Scheme: Ollama, Namespace: ns, Name: name, Tag: tag}, nil
}

func parseHTTP(raw string) (Source, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Source{}, parseErr(raw, "%v", err)
	}
	if u.Host == "" {
		return Source{}, parseErr(raw, "no host")
	}
	if u.Path == "" || u.Path == "/" {
		return Source{}, parseErr(raw, "no file path")
	}
	return Source{Raw: raw, Scheme: HTTP, URL: raw}, nil
}

func parseFile(raw string) (Source, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Source{}, parseErr(raw, "%v", err)
	}
	if u.Host != "" && u.Host != "localhost" {
		return Source{}, parseErr(raw, "host %q: a file:// source names a file on the Mac itself (file:///path)", u.Host)
	}
	// The root itself, however spelled ("/", "/.", "/.."), names no file.
	if !path.IsAbs(u.Path) || path.Clean(u.Path) == "/" {
		return Source{}, parseErr(raw, "want an absolute file path (file:///path/to/model.gguf)")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return Source{}, parseErr(raw, "a file path takes no query or fragment")
	}
	return Source{Raw: raw, Scheme: File, LocalPath: path.Clean(u.Path)}, nil
}

// String returns the canonical spelling of s (defaults written out).
func (s Source) String() string {
	switch s.Scheme {
	case HuggingFace:
		return fmt.Sprintf("hf://%s/%s/%s@%s", s.Org, s.Repo, s.Path, s.Revision)
	case Ollama:
		return fmt.Sprintf("ollama://%s/%s:%s", s.Namespace, s.Name, s.Tag)
	case HTTP:
		return s.URL
	case File:
		return (&url.URL{Scheme: "file", Path: s.LocalPath}).String()
	}
	return s.Raw
}

// escapePath escapes each segment of a slash path for use in a URL path.
func escapePath(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}
