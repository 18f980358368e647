package clustermode

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// watchSourcePolicy keeps h at the compiled SourcePolicy "default" (the built-in
// default while there is none). It returns the informer's HasSynced: fetches must
// wait for it, or the first ones would run under the default policy. A policy that
// does not compile (the API validates it, so only an older API server lets one
// through) keeps the previous one, and says so in the log.
func watchSourcePolicy(ctx context.Context, c cache.Cache, h *sourcepolicy.Holder, log logr.Logger) (func() bool, error) {
	inf, err := c.GetInformer(ctx, &v1alpha1.SourcePolicy{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("watching the source policy: %w", err)
	}
	set := func(obj any, deleted bool) {
		sp, ok := obj.(*v1alpha1.SourcePolicy)
		if !ok || sp.Name != v1alpha1.SourcePolicyName {
			return
		}
		if deleted {
			h.Set(nil)
			log.Info("SourcePolicy deleted: the built-in default applies", "SourcePolicy", sp.Name)
			return
		}
		p, err := sourcepolicy.Compile(sp)
		if err != nil {
			log.Error(err, "Ignoring a SourcePolicy that does not compile; the previous policy stays", "SourcePolicy", sp.Name)
			return
		}
		h.Set(p)
		log.V(2).Info("Source policy updated", "SourcePolicy", sp.Name, "resourceVersion", sp.ResourceVersion)
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { set(obj, false) },
		UpdateFunc: func(_, obj any) { set(obj, false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			set(obj, true)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watching the source policy: %w", err)
	}
	return reg.HasSynced, nil
}
