package clustermode

import (
	"context"
	"errors"
	"slices"

	"k8s.io/klog/v2"

	"github.com/macfleet/macfleet/agent/store"
	"github.com/macfleet/macfleet/api/v1alpha1"
	"github.com/macfleet/macfleet/internal/sourcepolicy"
)

// Store fetches models into the node's persistent store (agent/store implements it).
type Store interface {
	// Fetch makes the model at source (verified against sha256 when set) available
	// locally for a replica in namespace and returns its path, reporting progress as
	// it downloads. A source the fleet's source policy denies namespace fails with a
	// *sourcepolicy.DeniedError.
	Fetch(ctx context.Context, namespace, source, sha256 string, progress func(done, total int64)) (string, error)
}

// ChecksumError is implemented by fetch errors that mean the file did not match the
// expected sha256; the replica's Downloaded condition then says ChecksumMismatch.
type ChecksumError interface {
	error
	ChecksumMismatch() bool
}

// isChecksumMismatch says whether a fetch failed because the file's sha256 was not
// the expected one.
func isChecksumMismatch(err error) bool {
	var se *store.ChecksumError
	if errors.As(err, &se) {
		return true
	}
	var ce ChecksumError
	return errors.As(err, &ce) && ce.ChecksumMismatch()
}

// startFetchLocked starts downloading mr's model, replacing any record of key.
func (s *Syncer) startFetchLocked(ctx context.Context, key string, mr *v1alpha1.ModelReplica) {
	r := s.replicas[key]
	gen := 1
	if r != nil {
		gen = r.fetchGen + 1
	}
	fctx, cancel := context.WithCancel(ctx)
	r = &replica{key: key, namespace: mr.Namespace, name: mr.Name, uid: mr.UID, hash: mr.Spec.TemplateHash,
		template: *mr.Spec.Template.DeepCopy(), deployment: mr.Labels[v1alpha1.LabelDeployment], access: accessOf(mr), budgeted: slices.Clone(mr.Spec.BudgetedNamespaces),
		phase: phaseDownloading, fetchGen: gen, cancelFetch: cancel}
	s.replicas[key] = r
	src, sum := mr.Spec.Template.Model.Source, mr.Spec.Template.Model.SHA256
	log := s.log.WithValues("ModelReplica", klog.KObj(mr), "source", src)
	log.Info("Fetching the model")
	s.wg.Go(func() {
		defer cancel()
		path, err := s.opts.Store.Fetch(fctx, mr.Namespace, src, sum, func(done, total int64) { s.progress(key, gen, done, total) })
		var projector, draft string
		if err == nil {
			projector, err = fetchProjector(fctx, s.opts.Store, mr.Namespace, r.template.Model)
		}
		if err == nil {
			draft, err = fetchDraft(fctx, s.opts.Store, mr.Namespace, r.template.Model)
		}
		s.mu.Lock()
		cur := s.replicas[key]
		if cur != r || cur.fetchGen != gen || cur.phase != phaseDownloading {
			s.mu.Unlock()
			return // replaced or removed meanwhile
		}
		r.cancelFetch = nil
		if err != nil {
			r.phase = phaseDownloadFailed
			r.fetchErr = err
			r.fetchReason = v1alpha1.ReasonDownloadFailed
			switch {
			case isChecksumMismatch(err):
				r.fetchReason = v1alpha1.ReasonChecksumMismatch
			case sourcepolicy.IsDenied(err):
				r.fetchReason = v1alpha1.ReasonSourceNotAllowed
			}
			r.fetchFailures++
			r.retryAt = s.opts.Clock.Now().Add(backoff(r.fetchFailures, s.opts.FetchBackoffInitial, s.opts.FetchBackoffMax))
			if fctx.Err() == nil {
				log.Error(err, "Fetching the model failed", "failures", r.fetchFailures, "retryAt", r.retryAt)
			}
		} else {
			r.phase = phaseDownloaded
			r.path, r.projectorPath, r.draftPath = path, projector, draft
			r.fetchErr, r.fetchFailures = nil, 0
			if r.total == 0 {
				if fi, statErr := statSize(path); statErr == nil {
					r.done, r.total = fi, fi
				}
			} else {
				r.done = r.total
			}
			log.Info("Model stored", "path", path)
		}
		s.mu.Unlock()
		s.enqueue(key)
	})
}

// progress records download progress and requeues the replica at most once per
// ProgressInterval, so its status shows the progress without a write per chunk.
func (s *Syncer) progress(key string, gen int, done, total int64) {
	s.mu.Lock()
	r := s.replicas[key]
	if r == nil || r.fetchGen != gen || r.phase != phaseDownloading {
		s.mu.Unlock()
		return
	}
	r.done, r.total = done, total
	now := s.opts.Clock.Now()
	due := now.Sub(r.lastProgress) >= s.opts.ProgressInterval
	if due {
		r.lastProgress = now
	}
	s.mu.Unlock()
	if due {
		s.enqueue(key)
	}
}
