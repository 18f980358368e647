package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SourcePolicyName is the name of the one SourcePolicy the fleet reads. Without it,
// the built-in default applies: hf:// and ollama:// for every namespace, nothing else.
const SourcePolicyName = "default"

// ModelDeployment and ModelReplica condition reasons of the source policy.
const (
	// ReasonSourceNotAllowed: the model source, or an address it resolved to, is not
	// allowed by the SourcePolicy for the deployment's namespace.
	ReasonSourceNotAllowed = "SourceNotAllowed"
)

// SourceRegistry is a model registry a rule may allow.
// +kubebuilder:validation:Enum=hf;ollama
type SourceRegistry string

const (
	// RegistryHF allows hf:// sources (the Hugging Face hub or its configured mirror).
	RegistryHF SourceRegistry = "hf"
	// RegistryOllama allows ollama:// sources (the ollama registry or its configured
	// mirror).
	RegistryOllama SourceRegistry = "ollama"
)

// SourcePolicyRule grants model sources to namespaces.
type SourcePolicyRule struct {
	// namespaces are the namespaces the rule applies to, by name; "*" is every
	// namespace.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=63
	Namespaces []string `json:"namespaces"`

	// registries are the registries whose sources (hf://, ollama://) the namespaces
	// may use.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=2
	Registries []SourceRegistry `json:"registries,omitempty"`

	// hosts are the hosts https:// sources may name: a host name or IP address
	// ("models.example.com", "10.0.3.7"), or "*.example.com" for every subdomain of
	// example.com. Ports are not part of the match.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self.all(h, h.matches('^(\\\\*\\\\.)?[A-Za-z0-9]([A-Za-z0-9.:-]*[A-Za-z0-9])?$'))",message="hosts are host names or IP addresses without scheme, port or path, optionally starting with \"*.\""
	Hosts []string `json:"hosts,omitempty"`

	// allowPlainHTTP lets http:// (unencrypted) sources name the hosts too; by
	// default only https:// does.
	// +optional
	AllowPlainHTTP bool `json:"allowPlainHTTP,omitempty"`

	// fileDirectories are absolute directories on the Macs: a file:// source may name
	// a file below one of them. The agent resolves symbolic links before checking.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self.all(d, d.startsWith('/') && !d.contains('/../') && !d.endsWith('/..') && !d.contains('/./') && !d.endsWith('/.'))",message="fileDirectories must be absolute paths without . or .. segments"
	FileDirectories []string `json:"fileDirectories,omitempty"`
}

// SourcePolicySpec says which model sources each namespace may use, and which
// network addresses the manager and the agents may connect to when they fetch one.
type SourcePolicySpec struct {
	// rules grant sources to namespaces. A namespace may use a source when any rule
	// naming it (or "*") allows it; a namespace no rule names may use nothing.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Rules []SourcePolicyRule `json:"rules,omitempty"`

	// deniedNetworks are CIDRs that fetches never connect to, on top of the built-in
	// loopback (127.0.0.0/8, ::1), link-local (169.254.0.0/16, fe80::/10, which holds
	// cloud metadata endpoints), "this network" (0.0.0.0/8, ::), multicast, private
	// (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, fc00::/7), CGNAT (100.64.0.0/10),
	// benchmarking (198.18.0.0/15), reserved (240.0.0.0/4), and NAT64 (64:ff9b::/96,
	// 64:ff9b:1::/48), 6to4 (2002::/16) and Teredo (2001::/32), which embed an IPv4
	// address, ranges. List the cluster's service and
	// pod CIDRs here when they are public addresses. The check is made on the address
	// a connection is actually made to, after name resolution.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.all(c, isCIDR(c))",message="deniedNetworks must be CIDRs such as 10.96.0.0/12"
	DeniedNetworks []string `json:"deniedNetworks,omitempty"`

	// allowedNetworks are CIDRs exempt from the built-in denials and from
	// deniedNetworks, e.g. 127.0.0.0/8 for a fleet whose model server runs on the
	// same machine, or 192.168.1.20/32 for a model server in the Macs' LAN.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.all(c, isCIDR(c))",message="allowedNetworks must be CIDRs such as 127.0.0.0/8"
	AllowedNetworks []string `json:"allowedNetworks,omitempty"`
}

// SourcePolicy is the fleet's policy on model sources. It is cluster-scoped and
// there is one, named "default": the ValidatingAdmissionPolicy
// macfleet-source-policy checks every ModelDeployment's source against it, and the
// manager (memory estimates) and the agents (downloads, local files) enforce it
// again, including on the addresses a host name resolves to.
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=sp,categories=macfleet
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name == 'default'",message="the fleet reads only the SourcePolicy named \"default\""
type SourcePolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the policy.
	// +optional
	Spec SourcePolicySpec `json:"spec,omitempty"`
}

// SourcePolicyList is a list of SourcePolicy.
// +kubebuilder:object:root=true
type SourcePolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SourcePolicy `json:"items"`
}

func init() {
	SchemeBuilder.Register(&SourcePolicy{}, &SourcePolicyList{})
}
