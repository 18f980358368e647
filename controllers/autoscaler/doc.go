// Package autoscaler sizes autoscaled ModelDeployments from their load. Recommend is
// the decision, a pure function of the load history, the deployment's
// spec.autoscaling, its current replicas and the time; the controller measures the
// load through a LoadSource, calls it, writes spec.replicas and reports the decision
// in status.autoscaling, the Autoscaling condition and an Event on each scale.
package autoscaler
