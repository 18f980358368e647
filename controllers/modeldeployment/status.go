package modeldeployment

import (
	"fmt"
	"github.com/macfleet/macfleet/controllers/endpoints"
	"github.com/macfleet/macfleet/internal/bytesize"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/controllers/scheduler"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// maxMessageLength bounds the condition messages copied from errors and replicas.
const maxMessageLength = 1024

// replicaSummary is what the deployment's status says about its replicas.
type replicaSummary struct {
	// Total, Ready, Updated (current template) and UpdatedReady count replicas that
	// are not being deleted.
	Total, Ready, Updated, UpdatedReady int32
	// Old counts replicas of another template.
	Old int32
	// Unbound counts replicas without a node.
	Unbound int32
	// Unschedulable counts replicas whose Scheduled condition is False; First is the
	// first of them by name.
	Unschedulable      int32
	FirstUnschedulable *metav1.Condition
	// Failing counts replicas that cannot download or load their model (see
	// replicaFailure); FirstFailing is the first of them by name.
	Failing      int32
	FirstFailing *replicaFailureInfo
	// Nodes are the Macs holding a replica, sorted and unique.
	Nodes []string
}

// replicaFailureInfo is a failing replica and the condition that says why.
type replicaFailureInfo struct {
	Replica, Node string
	Condition     metav1.Condition
}

// failureReasons are the replica condition reasons that mean the replica cannot
// become ready without a change (of the source, the file, the policy) or a
// successful retry.
var failureReasons = sets.New(v1alpha1.ReasonDownloadFailed, v1alpha1.ReasonChecksumMismatch,
	v1alpha1.ReasonSourceNotAllowed, v1alpha1.ReasonLoadFailed)

// replicaFailure returns the condition of r that says it is failing — Downloaded,
// then Loaded, False with one of failureReasons — or, for an unbound replica the
// scheduler holds back for its namespace's FleetQuota, Scheduled False with
// QuotaExceeded (as a Deployment reports a Pod its ResourceQuota refused); else nil.
func replicaFailure(r *v1alpha1.ModelReplica) *metav1.Condition {
	if c := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ReplicaScheduled); c != nil && r.Spec.NodeName == "" &&
		c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.ReasonQuotaExceeded {
		return c
	}
	for _, typ := range []string{v1alpha1.ReplicaDownloaded, v1alpha1.ReplicaLoaded} {
		c := meta.FindStatusCondition(r.Status.Conditions, typ)
		if c != nil && c.Status == metav1.ConditionFalse && failureReasons.Has(c.Reason) {
			return c
		}
	}
	return nil
}

// summarize counts replicas (those being deleted or drained are skipped); current
// says whether a replica is of the deployment's current template.
func summarize(replicas []v1alpha1.ModelReplica, current func(*v1alpha1.ModelReplica) bool) replicaSummary {
	var s replicaSummary
	var firstName string
	for i := range replicas {
		r := &replicas[i]
		if r.DeletionTimestamp != nil || r.Spec.Drain != nil {
			continue
		}
		s.Total++
		ready := isReady(r)
		if ready {
			s.Ready++
		}
		if current(r) {
			s.Updated++
			if ready {
				s.UpdatedReady++
			}
		} else {
			s.Old++
		}
		if r.Spec.NodeName == "" {
			s.Unbound++
		} else {
			for _, n := range replicaNodes(r) {
				if !slices.Contains(s.Nodes, n) {
					s.Nodes = append(s.Nodes, n)
				}
			}
		}
		if c := meta.FindStatusCondition(r.Status.Conditions, v1alpha1.ReplicaScheduled); c != nil && c.Status == metav1.ConditionFalse && r.Spec.NodeName == "" {
			s.Unschedulable++
			if s.FirstUnschedulable == nil || r.Name < firstName {
				s.FirstUnschedulable, firstName = c, r.Name
			}
		}
		if c := replicaFailure(r); c != nil {
			s.Failing++
			if s.FirstFailing == nil || r.Name < s.FirstFailing.Replica {
				s.FirstFailing = &replicaFailureInfo{Replica: r.Name, Node: r.Spec.NodeName, Condition: *c}
			}
		}
	}
	slices.Sort(s.Nodes)
	return s
}

func isReady(r *v1alpha1.ModelReplica) bool {
	return meta.IsStatusConditionTrue(r.Status.Conditions, v1alpha1.ReplicaReady)
}

// statusInput is everything besides the replicas that the status reflects.
type statusInput struct {
	// Desired is spec.replicas.
	Desired int32
	// Reservation is the per-replica memory, nil when unknown.
	Reservation *resource.Quantity
	// EstimateErr is why the reservation is unknown.
	EstimateErr error
	// SourceErr is the source policy's denial of the deployment's source, which
	// stops everything else.
	SourceErr error
	// SplitRefusal says why the replicas of a deployment that may span Macs are
	// placed whole (reservation.SplitRefusal); empty otherwise.
	SplitRefusal string
	// Now stamps condition transitions.
	Now time.Time
	// ProgressDeadline is spec.progressDeadlineSeconds.
	ProgressDeadline time.Duration
	// Measured is the footprint measured for the current model and engine settings
	// (measuredFootprint), 0 when none; FootprintHash names those settings.
	Measured      int64
	FootprintHash string
}

// DefaultProgressDeadline is spec.progressDeadlineSeconds when unset.
const DefaultProgressDeadline = 600 * time.Second

// progressDeadline is md's spec.progressDeadlineSeconds.
func progressDeadline(md *v1alpha1.ModelDeployment) time.Duration {
	if p := md.Spec.ProgressDeadlineSeconds; p != nil && *p > 0 {
		return time.Duration(*p) * time.Second
	}
	return DefaultProgressDeadline
}

// noteProgress stamps status.lastProgressTime when the deployment made progress since
// the status it still holds: a new generation to act on, a replica created or
// removed, one more of the current template, or one more ready. It runs before
// setStatus overwrites the counts.
func noteProgress(md *v1alpha1.ModelDeployment, s replicaSummary, now time.Time) {
	st := &md.Status
	if st.LastProgressTime == nil || st.ObservedGeneration != md.Generation || s.Total != st.Replicas ||
		s.Updated > st.UpdatedReplicas || s.Ready > st.ReadyReplicas {
		t := metav1.NewTime(now)
		st.LastProgressTime = &t
	}
}

// progressLeft is how long md may still go without progress before its deadline,
// when it has progress to make (Progressing True with ScalingReplicas or
// ReplicasUpdating, or already ProgressDeadlineExceeded); ok is false otherwise.
func progressLeft(md *v1alpha1.ModelDeployment, deadline time.Duration, now time.Time) (left time.Duration, ok bool) {
	c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.DeploymentProgressing)
	if c == nil || md.Status.LastProgressTime == nil {
		return 0, false
	}
	switch c.Reason {
	case v1alpha1.ReasonScalingReplicas, v1alpha1.ReasonReplicasUpdating, v1alpha1.ReasonProgressDeadlineExceeded:
		return md.Status.LastProgressTime.Add(deadline).Sub(now), true
	}
	return 0, false
}

// setStatus writes md's status from the replica summary and in. It does not touch
// observedGeneration.
func setStatus(md *v1alpha1.ModelDeployment, s replicaSummary, in statusInput) {
	noteProgress(md, s, in.Now)
	st := &md.Status
	st.Replicas = s.Total
	st.ReadyReplicas = s.Ready
	st.UpdatedReplicas = s.Updated
	st.Ready = fmt.Sprintf("%d/%d", s.Ready, in.Desired)
	st.Selector = labels.SelectorFromSet(selectorLabels(md)).String()
	st.Nodes = s.Nodes
	st.EstimatedMemory = nil
	if in.Reservation != nil {
		q := in.Reservation.DeepCopy()
		st.EstimatedMemory = &q
	}
	st.MeasuredMemory, st.MeasuredFootprintHash = nil, ""
	if in.Measured > 0 {
		st.MeasuredMemory, st.MeasuredFootprintHash = resource.NewQuantity(in.Measured, resource.BinarySI), in.FootprintHash
	}
	st.Display = nil
	if st.EstimatedMemory != nil || st.MeasuredMemory != nil {
		st.Display = &v1alpha1.MemoryDisplay{Estimated: bytesize.Quantity(st.EstimatedMemory),
			Measured: bytesize.Quantity(st.MeasuredMemory)}
	}
	st.Endpoint = fmt.Sprintf("http://%s.%s.svc:%d", endpoints.ServiceName(md.Name), md.Namespace, endpoints.ServicePort)
	setAvailableCondition(md, s, in)
	setProgressingCondition(md, s, in)
	setScheduledCondition(md, s, in)
	setReplicaFailureCondition(md, s, in)
}

func setCondition(md *v1alpha1.ModelDeployment, now time.Time, typ string, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&md.Status.Conditions, metav1.Condition{
		Type:               typ,
		Status:             status,
		ObservedGeneration: md.Generation,
		LastTransitionTime: metav1.NewTime(now),
		Reason:             reason,
		Message:            truncate(msg),
	})
}

// setAvailableCondition follows Deployment semantics with maxUnavailable 0: available
// while at least the desired number of replicas are ready, of any template.
func setAvailableCondition(md *v1alpha1.ModelDeployment, s replicaSummary, in statusInput) {
	if s.Ready >= in.Desired {
		setCondition(md, in.Now, v1alpha1.DeploymentAvailable, metav1.ConditionTrue, v1alpha1.ReasonMinimumReplicasAvailable,
			fmt.Sprintf("%d of %d replicas ready", s.Ready, in.Desired))
		return
	}
	setCondition(md, in.Now, v1alpha1.DeploymentAvailable, metav1.ConditionFalse, v1alpha1.ReasonMinimumReplicasUnavailable,
		fmt.Sprintf("%d of %d replicas ready", s.Ready, in.Desired))
}

// setProgressingCondition is False while the reservation is unknown (nothing can
// progress), True with NewReplicasAvailable once every desired replica is of the
// current template and ready and no other remains, and True with ReplicasUpdating
// (old replicas left) or ScalingReplicas otherwise.
func setProgressingCondition(md *v1alpha1.ModelDeployment, s replicaSummary, in statusInput) {
	switch {
	case in.SourceErr != nil:
		setCondition(md, in.Now, v1alpha1.DeploymentProgressing, metav1.ConditionFalse, v1alpha1.ReasonSourceNotAllowed,
			in.SourceErr.Error())
	case in.EstimateErr != nil && sourcepolicy.IsDenied(in.EstimateErr):
		setCondition(md, in.Now, v1alpha1.DeploymentProgressing, metav1.ConditionFalse, v1alpha1.ReasonSourceNotAllowed,
			in.EstimateErr.Error())
	case in.EstimateErr != nil:
		setCondition(md, in.Now, v1alpha1.DeploymentProgressing, metav1.ConditionFalse, v1alpha1.ReasonEstimateFailed,
			"waiting for a memory estimate: "+in.EstimateErr.Error())
	case s.Total == in.Desired && s.UpdatedReady == in.Desired && s.Old == 0:
		setCondition(md, in.Now, v1alpha1.DeploymentProgressing, metav1.ConditionTrue, v1alpha1.ReasonNewReplicasAvailable,
			fmt.Sprintf("all %d replicas updated and ready", in.Desired))
	default:
		reason := v1alpha1.ReasonScalingReplicas
		msg := fmt.Sprintf("%d replicas, %d wanted, %d ready", s.Total, in.Desired, s.Ready)
		if s.Old > 0 {
			reason = v1alpha1.ReasonReplicasUpdating
			msg = fmt.Sprintf("%d of %d replicas updated, %d ready; %d old replicas left", s.Updated, in.Desired, s.UpdatedReady, s.Old)
		}
		if since := md.Status.LastProgressTime; in.ProgressDeadline > 0 && since != nil && in.Now.Sub(since.Time) >= in.ProgressDeadline {
			setCondition(md, in.Now, v1alpha1.DeploymentProgressing, metav1.ConditionFalse, v1alpha1.ReasonProgressDeadlineExceeded,
				fmt.Sprintf("no progress since %s (progressDeadlineSeconds %d): %s%s", since.UTC().Format(time.RFC3339),
					int(in.ProgressDeadline.Seconds()), msg, stuckBecause(s)))
			return
		}
		setCondition(md, in.Now, v1alpha1.DeploymentProgressing, metav1.ConditionTrue, reason, msg)
	}
}

// stuckBecause names what holds a deployment up, when a replica says so: the first
// failing replica, else the first unschedulable one.
func stuckBecause(s replicaSummary) string {
	switch {
	case s.FirstFailing != nil:
		f := s.FirstFailing
		return fmt.Sprintf("; replica %s is failing: %s: %s", f.Replica, f.Condition.Reason, f.Condition.Message)
	case s.FirstUnschedulable != nil:
		return "; unschedulable: " + s.FirstUnschedulable.Message
	}
	return ""
}

// setScheduledCondition is False with MemoryEstimateFailed while the reservation is
// unknown; False with the reason and message of the first unschedulable replica,
// prefixed with how many are, when any is; Unknown while replicas wait for the
// scheduler; True when every replica is bound.
func setScheduledCondition(md *v1alpha1.ModelDeployment, s replicaSummary, in statusInput) {
	switch {
	case in.SourceErr != nil:
		setCondition(md, in.Now, v1alpha1.DeploymentScheduled, metav1.ConditionFalse, v1alpha1.ReasonSourceNotAllowed,
			in.SourceErr.Error())
	case in.EstimateErr != nil && sourcepolicy.IsDenied(in.EstimateErr):
		setCondition(md, in.Now, v1alpha1.DeploymentScheduled, metav1.ConditionFalse, v1alpha1.ReasonSourceNotAllowed,
			in.EstimateErr.Error())
	case in.EstimateErr != nil:
		setCondition(md, in.Now, v1alpha1.DeploymentScheduled, metav1.ConditionFalse, v1alpha1.ReasonEstimateFailed,
			in.EstimateErr.Error())
	case s.Unschedulable > 0:
		c := s.FirstUnschedulable
		reason := c.Reason
		if reason == "" {
			reason = v1alpha1.ReasonUnschedulable
		}
		msg := fmt.Sprintf("%d of %d replicas unschedulable: %s", s.Unschedulable, s.Total, c.Message)
		if in.SplitRefusal != "" && reason == string(scheduler.ReasonInsufficientMemory) {
			// Too large for any one Mac, and a split would not serve it.
			reason = v1alpha1.ReasonSplitUnsupported
			msg += "; " + splitRefused(md, in) + "; serve it on one Mac: one with the replica's " +
				memoryOf(in.Reservation) + " free, or lower its memory with a smaller quant or a shorter engine.contextLength"
		}
		setCondition(md, in.Now, v1alpha1.DeploymentScheduled, metav1.ConditionFalse, reason, msg)
	case s.Unbound > 0 || s.Total < in.Desired:
		// Replicas not created yet wait too.
		setCondition(md, in.Now, v1alpha1.DeploymentScheduled, metav1.ConditionUnknown, v1alpha1.ReasonScheduledPending,
			fmt.Sprintf("%d of %d replicas waiting for a Mac", s.Unbound+max(0, in.Desired-s.Total), max(s.Total, in.Desired)))
	case s.Total == 0 && in.Desired == 0:
		setCondition(md, in.Now, v1alpha1.DeploymentScheduled, metav1.ConditionTrue, v1alpha1.ReasonNoReplicas,
			"no replicas requested")
	default:
		msg := fmt.Sprintf("all %d replicas bound to a Mac", s.Total)
		if in.SplitRefusal != "" {
			msg += ", each whole (" + splitRefused(md, in) + ")"
		}
		setCondition(md, in.Now, v1alpha1.DeploymentScheduled, metav1.ConditionTrue, v1alpha1.ReasonAllReplicasScheduled, msg)
	}
}

// splitRefused says that md's replicas are not split across Macs although
// placement.maxMacsPerReplica allows it, and why.
func splitRefused(md *v1alpha1.ModelDeployment, in statusInput) string {
	return fmt.Sprintf("placement.maxMacsPerReplica %d is not used: a split of this model across Macs is refused: %s",
		md.Spec.Placement.MaxMacsPerReplica, in.SplitRefusal)
}

// memoryOf is q in GiB for a message ("9.1GiB"), "memory" when unknown.
func memoryOf(q *resource.Quantity) string {
	if q == nil {
		return "memory"
	}
	return bytesize.Quantity(q)
}

// setReplicaFailureCondition sets ReplicaFailure True, with the reason and message
// of the first failing replica (by name), while any replica cannot download or load
// its model or waits for its namespace's FleetQuota, and removes it otherwise (as a Deployment does), so that `kubectl get md`
// shows the reason in its Failure column and `kubectl describe md` the message.
func setReplicaFailureCondition(md *v1alpha1.ModelDeployment, s replicaSummary, in statusInput) {
	if s.Failing == 0 {
		meta.RemoveStatusCondition(&md.Status.Conditions, v1alpha1.DeploymentReplicaFailure)
		return
	}
	f := s.FirstFailing
	node := f.Node
	if node == "" {
		node = "no Mac"
	}
	setCondition(md, in.Now, v1alpha1.DeploymentReplicaFailure, metav1.ConditionTrue, f.Condition.Reason,
		fmt.Sprintf("%d of %d replicas failing; replica %s on %s: %s: %s", s.Failing, s.Total, f.Replica, node,
			f.Condition.Type+" "+f.Condition.Reason, f.Condition.Message))
}

// failureEvent says which Warning Event to record after the status went from the
// conditions before to after: one with the ReplicaFailure condition's reason and
// message when it turned True or changed reason; ok is false otherwise, so that an
// unchanged failure is reported once, not on every pass.
func failureEvent(before, after []metav1.Condition) (reason, note string, ok bool) {
	c := meta.FindStatusCondition(after, v1alpha1.DeploymentReplicaFailure)
	if c == nil || c.Status != metav1.ConditionTrue {
		return "", "", false
	}
	if old := meta.FindStatusCondition(before, v1alpha1.DeploymentReplicaFailure); old != nil &&
		old.Status == metav1.ConditionTrue && old.Reason == c.Reason {
		return "", "", false
	}
	return c.Reason, c.Message, true
}

func truncate(s string) string {
	if len(s) <= maxMessageLength {
		return s
	}
	return strings.ToValidUTF8(s[:maxMessageLength-3], "") + "..."
}

// selectorLabels are the labels that select md's replicas.
func selectorLabels(md *v1alpha1.ModelDeployment) map[string]string {
	return map[string]string{v1alpha1.LabelDeployment: md.Name}
}
