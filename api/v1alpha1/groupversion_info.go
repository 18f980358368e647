// Package v1alpha1 contains the macfleet.dev/v1alpha1 API: MacNode, ModelDeployment and
// ModelReplica.
//
// +kubebuilder:object:generate=true
// +groupName=macfleet.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of these types.
	GroupVersion = schema.GroupVersion{Group: "macfleet.dev", Version: "v1alpha1"}

	// SchemeBuilder adds the types to a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this group-version to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
