package modeldeployment

import (
	"context"
	"errors"
	"net/http"

	"github.com/macfleet/macfleet/agent/hubtoken"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/modelsource"
)

// The estimate of an hf:// source reads the header of a gated or private repository
// with the fleet's hub token, the one every Mac downloads with (the Secret
// macfleet-system/macfleet-hub-token, package agent/hubtoken). No other source gets it.

// hubTokenSecret names the Secret of the fleet's hub token.
const hubTokenSecret = v1alpha1.SystemNamespace + "/" + hubtoken.SecretName

// HubRefusedError is the estimate of an hf:// source that the hub refused (401 or
// 403): the repository is gated or private, and the fleet has no hub token or its
// token has no access. Its message says which, and what to do.
type HubRefusedError struct {
	// Err is the hub's refusal (a *modelsource.StatusError).
	Err error
	// TokenSent says whether the request carried the fleet's hub token.
	TokenSent bool
}

func (e *HubRefusedError) Error() string {
	if !e.TokenSent {
		return e.Err.Error() + ": a gated or private repository needs the fleet's hub token: create the Secret " + hubTokenSecret +
			" with the token under the key " + hubtoken.Key + " (kubectl -n " + v1alpha1.SystemNamespace + " create secret generic " +
			hubtoken.SecretName + " --from-literal=" + hubtoken.Key + "=hf_…)"
	}
	return e.Err.Error() + ": the fleet's hub token (the Secret " + hubTokenSecret + ") has no access to this repository: " +
		"accept its terms on the hub with the token's account, or store a token that has access"
}

func (e *HubRefusedError) Unwrap() error { return e.Err }

// hubHeader is the header of the estimate's requests for src: the fleet's hub token
// as Authorization for an hf:// source when there is one, else none.
func (r *Reconciler) hubHeader(ctx context.Context, src modelsource.Source) http.Header {
	if src.Scheme != modelsource.HuggingFace || r.HubToken == nil {
		return nil
	}
	if tok := r.HubToken(ctx); tok != "" {
		return http.Header{"Authorization": {"Bearer " + tok}}
	}
	return nil
}

// hubRefusal is err as a *HubRefusedError when the hub refused src (an hf:// source)
// with 401 or 403, else err.
func hubRefusal(src modelsource.Source, tokenSent bool, err error) error {
	var status *modelsource.StatusError
	if src.Scheme != modelsource.HuggingFace || !errors.As(err, &status) ||
		(status.StatusCode != http.StatusUnauthorized && status.StatusCode != http.StatusForbidden) {
		return err
	}
	return &HubRefusedError{Err: err, TokenSent: tokenSent}
}
