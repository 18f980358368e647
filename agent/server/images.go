package server

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/macfleet/macfleet/internal/imagefetch"
	"github.com/macfleet/macfleet/internal/openaierr"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// InlineImagesFunc puts the http(s) images of a chat request inline (data: URIs)
// for namespace, the tenant of the deployment that serves it ("" when the server
// has none: standalone). An *imagefetch.Error is the caller's to fix.
type InlineImagesFunc func(ctx context.Context, namespace string, body []byte) ([]byte, error)

// CodeInvalidImageURL is the code of a 400 for an image URL that could not be put
// inline: refused by the source policy, not an image, too large, unreachable.
const CodeInvalidImageURL = "invalid_image_url"

// imageFetchTimeout bounds the fetch of one request's images.
const imageFetchTimeout = 60 * time.Second

// PolicyImages is the InlineImagesFunc of the source policy h holds: a namespace may
// fetch images from the hosts its rules list, through connections the policy checks
// (no loopback, link-local or private address, no redirect down to http).
// defaultNamespace stands for the namespace of a request that names none.
func PolicyImages(h *sourcepolicy.Holder, defaultNamespace string) InlineImagesFunc {
	client := h.Client(&http.Client{Timeout: imageFetchTimeout})
	return func(ctx context.Context, namespace string, body []byte) ([]byte, error) {
		if namespace == "" {
			namespace = defaultNamespace
		}
		in := &imagefetch.Inliner{Client: client, Admit: func(ctx context.Context, u string) (context.Context, error) {
			if err := h.Policy().DecideSource(namespace, u).Err(namespace, u); err != nil {
				return ctx, err
			}
			return sourcepolicy.ForSource(ctx, namespace, u), nil
		}}
		return in.Inline(ctx, body)
	}
}

// inlineImages returns the chat request body with its images inline (Options.InlineImages)
// for the namespace of the deployment that serves model; a request for a model that
// does not resolve is left as it is (generate answers it). ok is false when it
// answered the request with an error.
func (s *Server) inlineImages(w http.ResponseWriter, r *http.Request, model string, body []byte) ([]byte, bool) {
	namespace := ""
	if s.opts.ResolveModel != nil {
		entry, err := s.opts.ResolveModel(r, model)
		if err != nil {
			return body, true
		}
		if s.opts.DeploymentOf != nil {
			namespace, _, _ = strings.Cut(s.opts.DeploymentOf(entry), "/")
		}
	}
	out, err := s.opts.InlineImages(r.Context(), namespace, body)
	var ie *imagefetch.Error
	switch {
	case err == nil:
		return out, true
	case errors.As(err, &ie):
		writeError(w, invalid(CodeInvalidImageURL, ie.Param, "%s", ie.Message))
	default:
		writeError(w, &apiError{Status: http.StatusBadGateway, Type: openaierr.TypeServer, Code: openaierr.CodeUpstream,
			Message: "putting the request's images inline: " + err.Error()})
	}
	return nil, false
}
