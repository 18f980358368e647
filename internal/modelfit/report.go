package modelfit

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/macfleet/macfleet/internal/bytesize"
	"github.com/macfleet/macfleet/internal/estimate"
)

// Settings are the engine settings the model is estimated with, as a ModelDeployment's
// engine sets them.
type Settings struct {
	// Parallel is the sequences decoded together; each has the whole context, so the
	// KV cache holds Parallel × context cells. 0 means 1.
	Parallel int32 `json:"parallel"`
	// KVCacheType is the KV cache's element type; empty means f16.
	KVCacheType estimate.KVCacheType `json:"kvCacheType"`
}

// Model is what the header says of the model.
type Model struct {
	Source       string `json:"source"`
	Architecture string `json:"architecture"`
	Parameters   int64  `json:"parameters"`
	FileSize     int64  `json:"fileSize"`
	Weights      int64  `json:"weights"`
	// TrainedContext is the context the model was trained with; 0 when the header
	// does not say.
	TrainedContext int64 `json:"trainedContext"`
	// Projector is the multimodal projector counted beside the model; nil when none
	// was named.
	Projector *Projector `json:"projector,omitempty"`
	// Draft is the draft model counted beside the model; nil when none was named.
	Draft *Draft `json:"draft,omitempty"`
}

// Draft is a draft model for speculative decoding, counted in every need as the
// manager and the agent count it beside the model: its own estimate at the need's
// context and slots, but the runner's baseline (estimate.Result.DraftBytes).
type Draft struct {
	Source string `json:"source"`
	// Weights are its tensors; each need counts them, its KV cache and its compute
	// buffer.
	Weights int64 `json:"weights"`
	// Header is its GGUF header, read as the model's.
	Header *estimate.Header `json:"-"`
}

// Beside are the files a replica loads beside its model, counted in every need: a
// projector and a draft model, each nil when none was named.
type Beside struct {
	Projector *Projector
	Draft     *Draft
}

// Projector is a vision model's multimodal projector (an mmproj GGUF), counted in
// every need as the manager and the agent count it beside the model
// (estimate.Result.WithProjector).
type Projector struct {
	Source string `json:"source"`
	// Bytes is what it adds to its model's runner: its tensors and its image
	// encoder's compute buffer (estimate.Header.ProjectorBytes).
	Bytes int64 `json:"bytes"`
}

// Report is the answer of `macfleet models fit`.
type Report struct {
	Model    Model    `json:"model"`
	Settings Settings `json:"settings"`
	// Where says whose Macs these are: the kubeconfig's cluster, or one Mac.
	Where string   `json:"where"`
	Needs []Need   `json:"needs"`
	Macs  []MacFit `json:"macs"`
}

// Needs estimates h at each context with s, the total context being Parallel ×
// context as the controller sizes a deployment's engine, each need counting the files
// beside the model; it also returns what the header says of the model.
func Needs(h *estimate.Header, source string, contexts []int64, s Settings, with Beside) (Model, []Need, error) {
	parallel := max(s.Parallel, 1)
	var (
		m     Model
		needs []Need
	)
	for _, c := range contexts {
		total := c * int64(parallel)
		if total <= 0 || total > maxTotalContext {
			return Model{}, nil, fmt.Errorf("context %d × parallel %d is out of range (1 to %d tokens in all)", c, parallel, maxTotalContext)
		}
		p := estimate.Params{ContextLength: int32(total), Parallel: parallel, KVCacheType: s.KVCacheType}
		r, err := h.Estimate(p)
		if err != nil {
			return Model{}, nil, err
		}
		if with.Projector != nil {
			r = r.WithProjector(with.Projector.Bytes)
		}
		if d := with.Draft; d != nil {
			dr, err := d.Header.Estimate(p)
			if err != nil {
				return Model{}, nil, fmt.Errorf("the draft model %s: %w", d.Source, err)
			}
			r, d.Weights = r.WithDraft(dr.DraftBytes()), dr.Weights
		}
		m = Model{Source: source, Architecture: r.Dims.Architecture, Parameters: r.Dims.Params, FileSize: r.FileSize,
			Weights: r.Weights, TrainedContext: r.Dims.CtxTrain, Projector: with.Projector, Draft: with.Draft}
		needs = append(needs, Need{Context: c, Bytes: r.Total})
	}
	return m, needs, nil
}

// maxTotalContext bounds the context asked of the estimate (an int32 there).
const maxTotalContext = 1 << 30

// Write prints r as a table: a row per context, a column per Mac, then the largest
// context each Mac takes.
func (r Report) Write(w io.Writer) error {
	m := r.Model
	trained := "not in its header"
	if m.TrainedContext > 0 {
		trained = FormatContext(m.TrainedContext)
	}
	kv := r.Settings.KVCacheType
	if kv == "" {
		kv = estimate.KVF16
	}
	fmt.Fprintf(w, "Model:   %s\n", m.Source)
	fmt.Fprintf(w, "         %s, %s parameters, %s of weights, trained context %s\n",
		orUnknown(m.Architecture), FormatCount(m.Parameters), bytesize.Format(m.Weights), trained)
	if p := m.Projector; p != nil {
		fmt.Fprintf(w, "         with its projector %s: %s, counted in every need\n", p.Source, bytesize.Format(p.Bytes))
	}
	if d := m.Draft; d != nil {
		fmt.Fprintf(w, "         with its draft model %s: %s of weights and its KV cache, counted in every need\n", d.Source, bytesize.Format(d.Weights))
	}
	fmt.Fprintf(w, "Engine:  parallel %d, KV cache %s\n", max(r.Settings.Parallel, 1), kv)
	fmt.Fprintf(w, "Macs:    %s\n\n", r.Where)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := []string{"CONTEXT", "NEEDS"}
	for _, f := range r.Macs {
		head = append(head, fmt.Sprintf("%s (%s free of %s)", f.Mac.Name, bytesize.Format(f.Free), bytesize.Format(f.Capacity)))
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for i, n := range r.Needs {
		row := []string{FormatContext(n.Context), bytesize.Format(n.Bytes)}
		for _, f := range r.Macs {
			row = append(row, cellText(f.Cells[i]))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, f := range r.Macs {
		fmt.Fprintf(w, "%s: %s\n", f.Mac.Name, summary(f))
	}
	return nil
}

func cellText(c Cell) string {
	switch c.Verdict {
	case Fits:
		return "yes, " + bytesize.Format(c.Left) + " left"
	case FitsWhenFreed:
		return "once freed (" + bytesize.Format(-c.Left) + " short now)"
	}
	return "no (" + bytesize.Format(-c.Left) + " short)"
}

// summary is one line on the largest context f's Mac takes.
func summary(f MacFit) string {
	freed := "up to " + FormatContext(f.MaxContextFreed) + " context once its models (" + bytesize.Format(f.Mac.Committed) + " committed) are unloaded"
	var s string
	switch {
	case f.MaxContext > 0 && f.MaxContextFreed > f.MaxContext:
		s = "up to " + FormatContext(f.MaxContext) + " context now, " + freed
	case f.MaxContext > 0:
		s = "up to " + FormatContext(f.MaxContext) + " context now"
	case f.MaxContextFreed > 0:
		s = "not now; " + freed
	default:
		s = "too small at every context asked"
	}
	if f.Mac.Unavailable != "" {
		s += "; but it takes no new replicas now: " + f.Mac.Unavailable
	}
	return s
}

// FormatContext writes a context in tokens as 4k, 32k, 40k when a whole number of
// 1024s, else as the number.
func FormatContext(c int64) string {
	if c >= 1024 && c%1024 == 0 {
		return fmt.Sprintf("%dk", c/1024)
	}
	return fmt.Sprint(c)
}

// FormatCount writes a parameter count as 7.6B, 494M.
func FormatCount(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.0fM", float64(n)/1e6)
	}
	return fmt.Sprint(n)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown architecture"
	}
	return s
}
