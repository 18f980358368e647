package estimate

import "context"

// ProjectorComputeMin is the least headroom counted for a projector's image encoder
// beside its tensors: the compute graph of one image's patches, which mtmd allocates
// when it loads the projector.
const ProjectorComputeMin = 64 << 20

// projectorBytes is what a projector whose tensors take weights bytes adds to its
// model's runner: the tensors (mtmd loads them whole, once per runner) and the
// encoder's compute buffer, counted as a quarter of the tensors and at least
// ProjectorComputeMin.
func projectorBytes(weights int64) int64 {
	return weights + max(weights/4, ProjectorComputeMin)
}

// Projector reads the header of the projector (mmproj GGUF) at p.URL or p.Path, as
// Estimate reads a model's, and returns the memory it adds to its model's runner.
func Projector(ctx context.Context, p Params) (int64, error) {
	h, err := ReadHeader(ctx, p)
	if err != nil {
		return 0, err
	}
	return h.ProjectorBytes(), nil
}

// ProjectorBytes is the memory the projector whose header h is adds to its model's
// runner.
func (h *Header) ProjectorBytes() int64 { return projectorBytes(int64(h.gf.ModelSize)) }

// WithProjector is r with a projector's memory (Projector) counted in Total.
func (r Result) WithProjector(bytes int64) Result {
	r.Total += bytes - r.Projector
	r.Projector = bytes
	return r
}
