//go:build cgo && !race

package server

import "github.com/macfleet/macfleet/api/runnerapi"

// feedImages evaluates, for each prefilling slot whose next prompt position starts an
// image, that image (and any that follows it at once) before the step's batch: the
// projector encodes it and decodes its embeddings into the slot's sequence on their
// own, and the slot's cached tokens take the image's stand-in ids.
func (e *engine) feedImages() {
	for _, s := range e.slots {
		for s.job != nil && s.phase == phasePrefill && !s.job.embed {
			im := s.job.imageAt(s.fed)
			if im == nil {
				break
			}
			if err := e.feedImage(s, im); err != nil {
				s.job.fail(err)
				e.release(s)
				break
			}
		}
	}
}

// feedImage evaluates im for s; on failure the slot's sequence is dropped.
func (e *engine) feedImage(s *slot, im *promptImage) *runnerapi.Error {
	if im.proj.NonCausal() && im.n > e.nBatch {
		// Its tokens attend to each other both ways: all in one micro-batch.
		return runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "messages",
			"an image of %d tokens does not fit this runner's batch of %d (raise --batch)", im.n, e.nBatch)
	}
	if err := e.guard(im.n); err != nil {
		return err
	}
	if err := im.proj.EvalImage(e.ctx, im.chunk, len(s.cached), s.id, e.nBatch); err != nil {
		e.log.Error(err, "Evaluating an image failed", "slot", s.id, "tokens", im.n)
		e.ctx.SeqRm(s.id, -1, -1)
		s.cached = nil
		return runnerapi.Internal("evaluating an image: %v", err)
	}
	s.cached = append(s.cached, s.job.tokens[s.fed:s.fed+im.n]...)
	s.fed += im.n
	return nil
}
