package satoken

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
)

// DiscoveryPath is where the API server publishes its ServiceAccount issuer (OpenID
// Connect discovery), readable by every ServiceAccount (the ClusterRole
// system:service-account-issuer-discovery).
const DiscoveryPath = "/.well-known/openid-configuration"

// discoveryTimeout bounds the issuer's discovery at start.
const discoveryTimeout = 10 * time.Second

// DiscoverIssuer is the issuer of the API server's ServiceAccount tokens, read from
// its OpenID Connect discovery document through c (clientset.Discovery().RESTClient()).
func DiscoverIssuer(ctx context.Context, c rest.Interface) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, discoveryTimeout)
	defer cancel()
	raw, err := c.Get().AbsPath(DiscoveryPath).DoRaw(ctx)
	if err != nil {
		return "", fmt.Errorf("reading the API server's %s: %w", DiscoveryPath, err)
	}
	var doc struct {
		Issuer string `json:"issuer"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return "", fmt.Errorf("the API server's %s: %w", DiscoveryPath, err)
	}
	if doc.Issuer == "" {
		return "", errors.New("the API server's " + DiscoveryPath + " names no issuer")
	}
	return doc.Issuer, nil
}

// Issuer is the issuer tokens must name: flag when set (--token-issuer), else the API
// server's (DiscoverIssuer through c). When neither is known it logs why, and how to
// set it, and is "": tokens of any issuer are then reviewed, within the limits.
func Issuer(ctx context.Context, flag string, c rest.Interface, log logr.Logger) string {
	if flag != "" {
		return flag
	}
	iss, err := DiscoverIssuer(ctx, c)
	if err != nil {
		log.Error(err, "Cannot learn the cluster's ServiceAccount token issuer: tokens of any issuer reach a TokenReview "+
			"(within the review limits); set --token-issuer to the API server's --service-account-issuer")
		return ""
	}
	return iss
}
