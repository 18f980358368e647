package nodeauthz

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/macfleet/macfleet/api/v1alpha1"
)

// PreflightInterval is how often the manager asks again: an API server reconfigured to
// ask the node authorizer does not restart the manager.
const PreflightInterval = 10 * time.Minute

// ReasonNodeAuthorization is the reason of the manager's Event naming the mode in
// force, on its Deployment macfleet-system/macfleet-manager.
const ReasonNodeAuthorization = "NodeAuthorization"

// AddPreflight makes the manager tell, at its start and whenever it changes, which
// node authorization mode is in force (Preflight): in its log and in an Event on its
// Deployment. served says whether this manager serves the node authorizer.
func AddPreflight(mgr manager.Manager, served bool) error {
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return err
	}
	rec := mgr.GetEventRecorder("node-authorization")
	deploy := &appsv1.Deployment{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.SystemNamespace, Name: "macfleet-manager"}}
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		log := ctrl.Log.WithName("node-authorization")
		var last Mode
		for {
			mode, err := Preflight(ctx, cs)
			switch {
			case err != nil:
				log.Error(err, "Cannot tell which node authorization mode is in force")
			case mode != last:
				last = mode
				eventType := corev1.EventTypeNormal
				if mode == ModeNone {
					eventType = corev1.EventTypeWarning
					log.Error(nil, mode.Describe(), "mode", mode, "authorizerServed", served)
				} else {
					log.Info(mode.Describe(), "mode", mode, "authorizerServed", served)
				}
				rec.Eventf(deploy, nil, eventType, ReasonNodeAuthorization, "Preflight", "%s", mode.Describe())
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(PreflightInterval):
			}
		}
	}))
}
