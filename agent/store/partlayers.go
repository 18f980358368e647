package store

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/macfleet/macfleet/internal/ggufheader"
	"github.com/macfleet/macfleet/internal/modelsource"
)

// A split replica's worker shard holds a range of the model's layers, and its runner
// reads from the model's files only those layers' weights (metal/runner/netdevice).
// Of a model stored in parts, its Mac fetches the first part — whose header is the
// model's identity, which the head's runner checks at its greeting — and each other
// part that holds a tensor of one of its layers, read from the part's header by range
// requests. The parts it skips are absent beside the first: the worker's runner opens
// the parts present and names a missing one if it is ever asked for a tensor in it.

// LayerRange is the layers First..Last (inclusive, from 0) a split worker holds.
type LayerRange struct{ First, Last int }

// heldBy is the pure rule of whether a part whose header declares the tensors names
// holds weights of the layers lr: a tensor blk.N.… with N in lr. Tensors of no layer
// (the token embeddings, the output layer) are the head's.
func (lr LayerRange) heldBy(names []string) bool {
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, "blk.")
		if !ok {
			continue
		}
		num, _, ok := strings.Cut(rest, ".")
		if l, err := strconv.Atoi(num); ok && err == nil && l >= lr.First && l <= lr.Last {
			return true
		}
	}
	return false
}

// FetchLayers is Fetch for a split worker that holds the layers lr of the model: of a
// model stored in parts, it fetches the first part and the parts that hold tensors of
// those layers, each as Fetch fetches it, and names them beside the first; the others
// are neither downloaded nor named. Any other source is fetched as Fetch does, whole,
// and so is a model in parts of file:// sources (checked in place, nothing to save).
func (s *Store) FetchLayers(ctx context.Context, namespace, rawSource, sha256 string, lr LayerRange, progress func(done, total int64)) (string, error) {
	return s.fetch(ctx, namespace, rawSource, sha256, &lr, progress)
}

// partNeeded says whether part i (from 0) of the model r names is to be fetched: every
// part without a layer range, else the first and those holding its layers.
func (s *Store) partNeeded(ctx context.Context, r fetchReq, i int, part modelsource.Source) (bool, error) {
	if r.layers == nil || i == 0 || part.Scheme == modelsource.File {
		return true, nil
	}
	names, err := s.partTensors(ctx, r, i)
	if err != nil {
		return false, fmt.Errorf("reading the header of part %d of %s: %w", i+1, r.src.Raw, err)
	}
	need := r.layers.heldBy(names)
	s.log.V(2).Info("Read the tensors of a part", "source", part.Raw, "tensors", len(names), "layers",
		fmt.Sprintf("%d-%d", r.layers.First, r.layers.Last), "needed", need)
	return need, nil
}

// partTensors reads the tensor names of the header of part i of the remote model r
// names, by range requests with the client, policy and token of the store's downloads.
func (s *Store) partTensors(ctx context.Context, r fetchReq, i int) ([]string, error) {
	rem, err := s.locator.Locate(ctx, r.namespace, r.src.Raw)
	if err != nil {
		return nil, err
	}
	if i >= len(rem.Location.Parts) {
		return nil, fmt.Errorf("%s resolves to %d parts, not %d", r.src.Raw, len(rem.Location.Parts), r.src.Parts)
	}
	rem.Location = rem.Location.Parts[i]
	return ggufheader.TensorNames(&rangeReader{ctx: ctx, remote: rem}, ggufheader.DefaultLimits)
}

// rangeReaderChunk is what one range request of a header asks for.
const rangeReaderChunk = 256 << 10

// rangeReader reads a remote file from its start, one range request a chunk.
type rangeReader struct {
	ctx    context.Context
	remote Remote
	off    int64
	buf    []byte
	eof    bool
}

func (r *rangeReader) Read(p []byte) (int, error) {
	if len(r.buf) == 0 && !r.eof {
		if err := r.next(); err != nil {
			return 0, err
		}
	}
	if len(r.buf) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.buf)
	r.buf, r.off = r.buf[n:], r.off+int64(n)
	return n, nil
}

// next asks for the chunk at r.off.
func (r *rangeReader) next() error {
	url := r.remote.Location.URL
	req, err := http.NewRequestWithContext(r.ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	for k, v := range r.remote.Header {
		req.Header[k] = v
	}
	req.Header.Set("Accept-Encoding", "identity")
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", r.off, r.off+rangeReaderChunk-1))
	resp, err := r.remote.Client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	switch resp.StatusCode {
	case http.StatusRequestedRangeNotSatisfiable:
		r.eof = true
		return nil
	case http.StatusPartialContent:
	default:
		return &modelsource.StatusError{URL: url, StatusCode: resp.StatusCode, Status: resp.Status}
	}
	r.buf, err = io.ReadAll(io.LimitReader(resp.Body, rangeReaderChunk))
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	r.eof = len(r.buf) < rangeReaderChunk
	return nil
}
