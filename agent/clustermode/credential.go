package clustermode

import (
	"context"
	"errors"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"

	"github.com/macfleet/macfleet/internal/credentials"
)

// CredentialRenewal has the agent renew its node token before it expires, rewriting
// kubeconfig (credentials.KubeconfigFile: the file to rewrite, "" for none) with each
// new one (credentials.Rotator): every client made from rc afterwards uses the
// current token. The Runnable runs the renewals; it is nil for a credential that is
// not a bound node token, which is used as it is until it expires.
func CredentialRenewal(rc *rest.Config, kubeconfig string, log logr.Logger) (Runnable, error) {
	rot, err := credentials.NewRotator(rc, kubeconfig, log.WithName("credential"))
	switch {
	case errors.Is(err, credentials.ErrNotRenewable):
		log.Info("The node credential is not a bound node token: it is used as it is until it expires; "+
			"`macfleet nodes credentials` issues one the agent renews", "kubeconfig", kubeconfig)
		return nil, nil
	case err != nil:
		return nil, err
	}
	c := rot.Claims()
	log.Info("Renewing the node token before it expires", "expires", c.Expires, "renewAt", credentials.RenewAt(c),
		"boundTo", c.Namespace+"/"+c.Secret)
	return func(ctx context.Context, _ Env) error { return rot.Run(ctx) }, nil
}
