package modelsource

// DeniedError is a source, or an address, the source policy does not allow. Its
// message names the fix. It is not retryable as such: fetching again helps only once
// the policy changed. The policy (package sourcepolicy) returns it; readers of sources
// recognise it with errors.As.
type DeniedError struct {
	// Namespace is the namespace whose rules were applied; empty for an address check
	// (the address rules are the same for every namespace).
	Namespace string
	// Source is the model source, or the address dialled.
	Source string
	// Reason is the policy decision's reason.
	Reason string
}

func (e *DeniedError) Error() string { return e.Reason }
