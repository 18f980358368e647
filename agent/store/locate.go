package store

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/macfleet/macfleet/internal/modelsource"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// Locator finds where a model source's file can be read without storing it, under the
// same source policy, endpoints and token as a Store's downloads: for reading a GGUF
// header by range requests (`macfleet models fit`). It needs no store directory.
type Locator struct {
	resolver *modelsource.Resolver
	client   *http.Client
	policy   *sourcepolicy.Holder
	hfToken  hubToken
}

// hubToken is the token sent with hf:// requests: a fixed one, else what source gives.
type hubToken struct {
	static string
	source func(context.Context) string
}

// get is the token for a request of src ("" for none, and for any other scheme).
func (h hubToken) get(ctx context.Context, src modelsource.Source) string {
	switch {
	case src.Scheme != modelsource.HuggingFace:
		return ""
	case h.static != "" || h.source == nil:
		return h.static
	}
	return h.source(ctx)
}

// NewLocator returns a Locator configured as New configures a Store; only HFEndpoint,
// HFToken, OllamaRegistry, HTTPClient and Policy are used.
func NewLocator(opts Options) *Locator {
	policy := opts.Policy
	if policy == nil {
		policy = sourcepolicy.NewHolder(nil)
	}
	// Every client goes through Policy.Client, the default one too: it is what checks
	// each redirect (hosts, https to http) as well as each connection.
	hc := opts.HTTPClient
	if hc == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.ResponseHeaderTimeout = DefaultResponseHeaderTimeout
		tr.DisableCompression = true
		hc = &http.Client{Transport: tr}
	}
	client := policy.Client(hc)
	return &Locator{policy: policy, client: client, hfToken: hubToken{static: opts.HFToken, source: opts.HFTokenSource},
		resolver: &modelsource.Resolver{HFEndpoint: opts.HFEndpoint, OllamaRegistry: opts.OllamaRegistry, HTTPClient: client}}
}

// Remote is where a source's file is served, and how to ask for it.
type Remote struct {
	// Location is the resolved source: its URL, and for ollama:// the digest and size
	// the registry's manifest gives.
	Location modelsource.Location
	// Client makes the requests: the policy checks each connection it makes and each
	// redirect it follows (for an http(s):// source, against the namespace's hosts).
	Client *http.Client
	// Header goes with every request: the hub token for an hf:// source, when set.
	Header http.Header
}

// Locate decides whether namespace may use rawSource (a *sourcepolicy.DeniedError
// otherwise, its message naming the fix) and resolves it (an ollama:// source's
// manifest is fetched) without downloading the file. For a model stored in parts,
// rawSource names the first, Location.Parts every one; the same client and header
// serve them all. A file:// source is refused: it
// is a file on the machine that reads it, not something to locate.
func (l *Locator) Locate(ctx context.Context, namespace, rawSource string) (Remote, error) {
	src, err := modelsource.Parse(rawSource)
	if err != nil {
		return Remote{}, err
	}
	if src.Scheme == modelsource.File {
		return Remote{}, fmt.Errorf("%s: a file:// source is read in place, not located", rawSource)
	}
	if err := l.policy.Policy().DecideSource(namespace, rawSource).Err(namespace, rawSource); err != nil {
		return Remote{}, err
	}
	loc, err := l.resolve(ctx, src)
	if err != nil {
		return Remote{}, err
	}
	r := Remote{Location: loc, Client: l.client}
	if src.Scheme == modelsource.HTTP {
		r.Client = forSource(l.client, namespace, rawSource)
	}
	if tok := l.hfToken.get(ctx, src); tok != "" {
		r.Header = http.Header{"Authorization": {"Bearer " + tok}}
	}
	return r, nil
}

// resolve resolves src, bounding an ollama manifest's fetch by manifestTimeout.
func (l *Locator) resolve(ctx context.Context, src modelsource.Source) (modelsource.Location, error) {
	if src.Scheme == modelsource.Ollama {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, manifestTimeout)
		defer cancel()
	}
	loc, err := l.resolver.Resolve(ctx, src)
	var denied *sourcepolicy.DeniedError
	if errors.As(err, &denied) {
		return loc, fmt.Errorf("resolving %s: %w", src.Raw, denied)
	}
	return loc, err
}

// forSource is a copy of c whose redirects are checked as those of requests made with
// sourcepolicy.ForSource(ctx, namespace, raw), whatever context they were made with.
func forSource(c *http.Client, namespace, raw string) *http.Client {
	out := *c
	check := c.CheckRedirect
	out.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		return check(req.WithContext(sourcepolicy.ForSource(req.Context(), namespace, raw)), via)
	}
	return &out
}
