package modelsource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// OllamaModelMediaType is the media type of the layer of an ollama manifest that holds
// the GGUF file.
const OllamaModelMediaType = "application/vnd.ollama.image.model"

// ollamaManifestAccept is what the registry serves ollama manifests as.
const ollamaManifestAccept = "application/vnd.docker.distribution.manifest.v2+json"

// maxManifestBytes bounds how much of a manifest response is read.
const maxManifestBytes = 1 << 20

// Resolver turns parsed sources into locations. The zero value uses the production
// endpoints; tests point the endpoints at an httptest server.
type Resolver struct {
	// HFEndpoint is the Hugging Face hub, DefaultHFEndpoint when empty.
	HFEndpoint string
	// OllamaRegistry is the ollama registry, DefaultOllamaRegistry when empty.
	OllamaRegistry string
	// HTTPClient fetches registry manifests; a client with a 30 s timeout when nil.
	HTTPClient *http.Client
}

// Location is where a resolved source can be read from: exactly one of URL and
// LocalPath is set.
type Location struct {
	// Source is what was resolved.
	Source Source
	// URL is an http(s) URL that serves the GGUF file (range requests where the
	// server supports them).
	URL string
	// LocalPath is a path on the local disk (file:// sources).
	LocalPath string
	// Digest is the expected digest of the file when the source names one
	// ("sha256:<hex>" from an ollama manifest), else empty.
	Digest string
	// Size is the file's size in bytes when the source says it (ollama manifests),
	// else 0.
	Size int64
	// Parts, for a model stored in several files (Source.Parts), are the locations of
	// every part in order, the first (this one, without Parts) included; nil for a
	// model in one file.
	Parts []Location
}

// IsLocal reports whether the location is a path on the local disk.
func (l Location) IsLocal() bool { return l.LocalPath != "" }

// StatusError is an HTTP response with an unexpected status.
type StatusError struct {
	URL        string
	StatusCode int
	Status     string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("GET %s: %s", e.URL, e.Status)
}

// NotFound reports whether the server said the resource does not exist.
func (e *StatusError) NotFound() bool { return e.StatusCode == http.StatusNotFound }

// UnreachableError is a request that got no HTTP response at all: DNS, connection
// refused, TLS, timeout.
type UnreachableError struct {
	URL string
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("%s unreachable: %v", e.URL, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// ManifestError is an ollama manifest that cannot be used: not JSON, or without a
// model layer.
type ManifestError struct {
	URL    string
	Reason string
}

func (e *ManifestError) Error() string {
	return fmt.Sprintf("ollama manifest %s: %s", e.URL, e.Reason)
}

// ResolveString parses s and resolves it.
func (r *Resolver) ResolveString(ctx context.Context, s string) (Location, error) {
	src, err := Parse(s)
	if err != nil {
		return Location{}, err
	}
	return r.Resolve(ctx, src)
}

// Resolve returns where src can be read from, every part of a model stored in parts
// (Location.Parts). Only ollama:// sources use the network (the manifest names the
// blob). Errors are *StatusError, *UnreachableError or
// *ManifestError, wrapped with context.
func (r *Resolver) Resolve(ctx context.Context, src Source) (Location, error) {
	if src.Parts < 2 {
		return r.resolveFile(ctx, src)
	}
	var parts []Location
	for _, p := range src.PartSources() {
		loc, err := r.resolveFile(ctx, p)
		if err != nil {
			return Location{}, err
		}
		parts = append(parts, loc)
	}
	first := parts[0]
	first.Parts = parts
	return first, nil
}

// resolveFile resolves a source of one file.
func (r *Resolver) resolveFile(ctx context.Context, src Source) (Location, error) {
	switch src.Scheme {
	case HuggingFace:
		return Location{Source: src, URL: r.HFURL(src)}, nil
	case HTTP:
		return Location{Source: src, URL: src.URL}, nil
	case File:
		return Location{Source: src, LocalPath: src.LocalPath}, nil
	case Ollama:
		return r.resolveOllama(ctx, src)
	}
	return Location{}, parseErr(src.Raw, "unknown scheme %q", src.Scheme)
}

// HFURL is the hub's download URL of an hf:// source.
func (r *Resolver) HFURL(src Source) string {
	rev := src.Revision
	if rev == "" {
		rev = DefaultHFRevision
	}
	return fmt.Sprintf("%s/%s/%s/resolve/%s/%s", endpoint(r.HFEndpoint, DefaultHFEndpoint),
		url.PathEscape(src.Org), url.PathEscape(src.Repo), url.PathEscape(rev), escapePath(src.Path))
}

// OllamaManifestURL is the registry URL of an ollama:// source's manifest.
func (r *Resolver) OllamaManifestURL(src Source) string {
	return fmt.Sprintf("%s/v2/%s/%s/manifests/%s", endpoint(r.OllamaRegistry, DefaultOllamaRegistry),
		url.PathEscape(src.Namespace), url.PathEscape(src.Name), url.PathEscape(src.Tag))
}

// OllamaBlobURL is the registry URL of one blob of an ollama:// source.
func (r *Resolver) OllamaBlobURL(src Source, digest string) string {
	return fmt.Sprintf("%s/v2/%s/%s/blobs/%s", endpoint(r.OllamaRegistry, DefaultOllamaRegistry),
		url.PathEscape(src.Namespace), url.PathEscape(src.Name), url.PathEscape(digest))
}

type ollamaManifest struct {
	Layers []struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int64  `json:"size"`
	} `json:"layers"`
}

func (r *Resolver) resolveOllama(ctx context.Context, src Source) (Location, error) {
	u := r.OllamaManifestURL(src)
	body, err := r.get(ctx, u, ollamaManifestAccept)
	if err != nil {
		return Location{}, fmt.Errorf("resolving %s: %w", src.Raw, err)
	}
	var m ollamaManifest
	if err := json.Unmarshal(body, &m); err != nil {
		return Location{}, fmt.Errorf("resolving %s: %w", src.Raw, &ManifestError{URL: u, Reason: "not JSON: " + err.Error()})
	}
	for _, l := range m.Layers {
		if l.MediaType != OllamaModelMediaType {
			continue
		}
		algo, hex, ok := strings.Cut(l.Digest, ":")
		if !ok || algo == "" || hex == "" || strings.ContainsAny(l.Digest, "/?#") {
			return Location{}, fmt.Errorf("resolving %s: %w", src.Raw, &ManifestError{URL: u, Reason: fmt.Sprintf("model layer has a malformed digest %q", l.Digest)})
		}
		return Location{Source: src, URL: r.OllamaBlobURL(src, l.Digest), Digest: l.Digest, Size: l.Size}, nil
	}
	return Location{}, fmt.Errorf("resolving %s: %w", src.Raw, &ManifestError{URL: u, Reason: "no layer of media type " + OllamaModelMediaType})
}

func (r *Resolver) get(ctx context.Context, u, accept string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("building request for %s: %w", u, err)
	}
	req.Header.Set("Accept", accept)
	resp, err := r.client().Do(req)
	if err != nil {
		return nil, Unreachable(u, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, &StatusError{URL: u, StatusCode: resp.StatusCode, Status: resp.Status}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxManifestBytes))
	if err != nil {
		return nil, Unreachable(u, err)
	}
	return body, nil
}

// Unreachable wraps a transport error as *UnreachableError, keeping context
// cancellation visible to errors.Is.
func Unreachable(u string, err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return &UnreachableError{URL: u, Err: err}
}

func (r *Resolver) client() *http.Client {
	if r.HTTPClient != nil {
		return r.HTTPClient
	}
	return defaultClient
}

var defaultClient = &http.Client{Timeout: 30 * time.Second}

func endpoint(v, def string) string {
	if v == "" {
		v = def
	}
	return strings.TrimRight(v, "/")
}
