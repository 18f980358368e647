// Package kubescheme builds the one runtime.Scheme that macfleet's clients, caches and
// managers share: client-go's built-in types and the macfleet.dev API. The manager, the
// gateway, the agent in cluster mode and `macfleet usage` all read and write the fleet
// through it.
package kubescheme

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	mfv1 "github.com/macfleet/macfleet/api/v1alpha1"
)

// New returns a fresh scheme with client-go's types and the macfleet API.
func New() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("adding client-go's types: %w", err)
	}
	if err := mfv1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("adding the macfleet API: %w", err)
	}
	return s, nil
}
