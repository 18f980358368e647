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

	// Parts is the number of files of a model stored in parts whose first part the
	// source names (NAME-00001-of-0000N.gguf, N > 1); 0 for a model in one file.
	Parts int
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

// IsSplitPart says whether the file name is a part of a model stored in several files
// (NAME-00001-of-0000N.gguf).
func IsSplitPart(name string) bool { return splitPart.MatchString(name) }

// PartName is the file name of part no (from 1) of count of a model stored in parts,
// as llama.cpp names them: prefix-00001-of-00003.gguf.
func PartName(prefix string, no, count int) string {
	return fmt.Sprintf("%s-%05d-of-%05d.gguf", prefix, no, count)
}

// splitName reads the name of a part: its prefix, its index from 1 and the number of
// parts. ok is false when name is not a part's; err says why a name shaped like a
// part's cannot be loaded as one.
func splitName(name string) (prefix string, no, count int, ok bool, err error) {
	if !IsSplitPart(name) {
		return "", 0, 0, false, nil
	}
	const suffix = len("-00001-of-00003.gguf")
	prefix = name[:len(name)-suffix]
	_, serr := fmt.Sscanf(strings.ToLower(name[len(prefix):]), "-%05d-of-%05d.gguf", &no, &count)
	switch {
	case serr != nil || no < 1 || no > count:
		return "", 0, 0, true, fmt.Errorf("%q is not a part of a model stored in parts: its number must be from 1 to the count", path.Base(name))
	case PartName(prefix, no, count) != name:
		return "", 0, 0, true, fmt.Errorf("%q: a part's name must end in -NNNNN-of-NNNNN.gguf, lowercase, as the runner looks its other parts up", path.Base(name))
	}
	return prefix, no, count, true, nil
}

// Parse checks the syntax of a model source and splits it into its parts. It does not
// touch the network. Errors are *ParseError. A source may name the first part of a
// model stored in several files (NAME-00001-of-0000N.gguf): Parts says how many; a
// later part is refused with the name of the first.
func Parse(s string) (Source, error) {
	src, err := parse(s)
	if err != nil {
		return Source{}, err
	}
	name := src.fileName()
	prefix, no, count, ok, err := splitName(name)
	switch {
	case err != nil:
		return Source{}, parseErr(s, "%v", err)
	case !ok:
		return src, nil
	case no != 1:
		return Source{}, parseErr(s, "%q is part %d of the %d files of a model: name its first part, %s",
			path.Base(name), no, count, src.withFile(name, PartName(prefix, 1, count)).Raw)
	}
	if count > 1 {
		src.Parts = count
	}
	return src, nil
}

// FileName is the name of the file a source names, without its directory ("" for
// ollama://).
func (s Source) FileName() string {
	if n := s.fileName(); n != "" {
		return path.Base(n)
	}
	return ""
}

// fileName is the path (hf://, file://) or URL path (http(s)://) of the file a source
// names; "" for ollama://.
func (s Source) fileName() string {
	if s.Scheme == HTTP {
		if u, err := url.Parse(s.URL); err == nil {
			return u.Path
		}
	}
	return s.Path + s.LocalPath
}

// withFile is s naming the file to instead of from (a sibling: same directory), and
// Raw spelled as s's with the name replaced.
func (s Source) withFile(from, to string) Source {
	switch s.Scheme {
	case HuggingFace:
		s.Path = to
	case File:
		s.LocalPath = to
	case HTTP:
		if u, err := url.Parse(s.URL); err == nil {
			u.Path, u.RawPath = to, ""
			s.URL = u.String()
		}
	}
	fromBase, toBase := path.Base(from), path.Base(to)
	if i := strings.LastIndex(s.Raw, fromBase); i >= 0 && s.Scheme != HTTP {
		s.Raw = s.Raw[:i] + toBase + s.Raw[i+len(fromBase):]
	} else {
		s.Raw = s.String()
	}
	return s
}

// PartSources are the sources of every file of the model s names, in order: s itself
// for a model in one file; for one stored in parts, s (the first) then the others,
// each naming its own file (Parts unset).
func (s Source) PartSources() []Source {
	if s.Parts < 2 {
		return []Source{s}
	}
	name := s.fileName()
	prefix, _, _, _, _ := splitName(name)
	out := make([]Source, 0, s.Parts)
	out = append(out, s)
	for no := 2; no <= s.Parts; no++ {
		p := s.withFile(name, PartName(prefix, no, s.Parts))
		p.Parts = 0
		out = append(out, p)
	}
	return out
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
