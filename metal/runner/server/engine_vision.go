//go:build cgo && !race

package server

import (
	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/runner/llama"
)

// imageEval is what evaluating an image into a slot's sequence needs of the engine:
// its context, its batch, its memory guard and its log.
type imageEval struct {
	ctx    *llama.Context
	nBatch int
	guard  func(n int) *runnerapi.Error
	log    logr.Logger
}

// feedImages evaluates, for each prefilling slot whose next prompt position starts an
// image, that image (and any that follows it at once) before the step's batch: the
// projector encodes it and decodes its embeddings into the slot's sequence on their
// own, and the slot's cached tokens take the image's stand-in ids. A slot whose image
// fails is failed and handed to release.
func feedImages(slots []*slot, x imageEval, release func(*slot)) {
	for _, s := range slots {
		for s.job != nil && s.phase == phasePrefill && !s.job.embed {
			im := s.job.imageAt(s.fed)
			if im == nil {
				break
			}
			if err := x.feed(s, im); err != nil {
				s.job.fail(err)
				release(s)
				break
			}
		}
	}
}

// feed evaluates im for s; on failure the slot's sequence is dropped.
func (x imageEval) feed(s *slot, im *promptImage) *runnerapi.Error {
	if im.proj.NonCausal() && im.n > x.nBatch {
		// Its tokens attend to each other both ways: all in one micro-batch.
		return runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "messages",
			"an image of %d tokens does not fit this runner's batch of %d (raise --batch)", im.n, x.nBatch)
	}
	if err := x.guard(im.n); err != nil {
		return err
	}
	if err := im.proj.EvalImage(x.ctx, im.chunk, len(s.cached), s.id, x.nBatch); err != nil {
		x.log.Error(err, "Evaluating an image failed", "slot", s.id, "tokens", im.n)
		x.ctx.SeqRm(s.id, -1, -1)
		s.cached = nil
		return runnerapi.Internal("evaluating an image: %v", err)
	}
	s.cached = append(s.cached, s.job.tokens[s.fed:s.fed+im.n]...)
	s.fed += im.n
	return nil
}
