package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/macfleet/macfleet/internal/ggufsynth"
)

// cardInfo is what -gpu adds to a run: the bytes of weights one decode step reads, the
// bound the card's memory bandwidth sets on decode being those bytes a step.
type cardInfo struct {
	stepBytes, tensorBytes float64
}

// newCardInfo reads the model's tensor table and warns when either server's GPU backend
// is not where it looks for it (a server without one computes on the CPU: the card's
// memory after loading, in the table's header, then shows it).
func newCardInfo(o options, model string, spec ggufsynth.Spec) (*cardInfo, error) {
	step, total, err := stepBytes(model)
	if err != nil {
		return nil, err
	}
	for _, d := range []struct{ who, dir string }{
		{"macfleet's runner", filepath.Join(filepath.Dir(o.runner), "lib")},
		{"the peer", cmp.Or(o.peerLib, filepath.Join(filepath.Dir(o.peer), "..", "lib", "ollama"))},
	} {
		if m, _ := filepath.Glob(filepath.Join(d.dir, "libggml-cuda*.so*")); len(m) == 0 {
			if m, _ = filepath.Glob(filepath.Join(d.dir, "*", "libggml-cuda*.so*")); len(m) == 0 {
				say("warning: no libggml-cuda.so in %s, where %s looks for its GPU backend", d.dir, d.who)
			}
		}
	}
	say("on the card: a decode step reads %.2f GB of the %s model's %.2f GB of weights; at %.3g bytes/s that bounds one stream at %.0f tokens/s",
		step/1e9, spec.DType, total/1e9, o.hbm, o.hbm/step)
	return &cardInfo{stepBytes: step, tensorBytes: total}, nil
}

// stepBytes reads a GGUF file's tensor table: the bytes of weights one decode step
// reads (every tensor's but the token embedding's, of which a sequence reads one row;
// a model without an output projection reads its embedding whole for the logits) and
// the bytes of all its tensors.
func stepBytes(path string) (step, total float64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	g, err := ggml.Decode(f, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("reading the tensors of %s: %w", path, err)
	}
	var embd *ggml.Tensor
	untied := false
	for _, t := range g.Tensors().Items() {
		total += float64(t.Size())
		switch t.Name {
		case "token_embd.weight":
			embd = t
		case "output.weight":
			untied = true
		}
	}
	if embd == nil || len(embd.Shape) != 2 || embd.Shape[1] == 0 {
		return 0, 0, fmt.Errorf("%s has no token embedding matrix", path)
	}
	step = total
	if untied {
		step -= float64(embd.Size()) - float64(embd.Size())/float64(embd.Shape[1])
	}
	return step, total, nil
}

// column is the table's "of HBM bound" column: for each decode row and subject shown,
// the median's decode steps a second (tokens a second over streams: a step reads the
// weights once for all its streams) times the bytes a step reads, over the bandwidth.
func (c *cardInfo) column(samples map[string]map[string][]float64, shown []column, hbm float64) extraColumn {
	titles := make([]string, len(shown))
	for i, s := range shown {
		titles[i] = s.title
	}
	return extraColumn{
		title: "of HBM bound (" + strings.Join(titles, " / ") + ")",
		cell: func(m metric) string {
			if m.streams == 0 {
				return ""
			}
			cells := make([]string, len(shown))
			for i, s := range shown {
				cells[i] = "—"
				if sum := summarize(samples[s.subject][m.key]); sum.n > 0 {
					cells[i] = fmt.Sprintf("%.0f %%", 100*sum.median/float64(m.streams)*c.stepBytes/hbm)
				}
			}
			return strings.Join(cells, " / ")
		},
	}
}

// header is the card's paragraph of the table's header.
func (c *cardInfo) header(o options, sets []setup, cards []string) string {
	var b strings.Builder
	b.WriteString("On the card (-gpu): the peer matched with num_gpu at every layer")
	if o.peerLib != "" {
		fmt.Fprintf(&b, " and OLLAMA_LIBRARY_PATH %s", o.peerLib)
	}
	fmt.Fprintf(&b, ", at its defaults as it chooses; macfleet's runner with the backend in %s. "+
		"A decode step reads %.2f GB of the model's %.2f GB (all but the token embedding, of which one row); "+
		"\"of HBM bound\" is a median's steps a second (tokens a second over streams) times those bytes over %.3g bytes/s, "+
		"which bounds one stream at %.0f tokens/s.", filepath.Join(filepath.Dir(o.runner), "lib"),
		c.stepBytes/1e9, c.tensorBytes/1e9, o.hbm, o.hbm/c.stepBytes)
	for i, m := range cards {
		what := "the card after loading"
		if i < len(sets) && sets[i].name != "" {
			what += " for the " + sets[i].name + " prompts"
		}
		fmt.Fprintf(&b, " %s: %s.", capitalize(what), m)
	}
	return b.String() + "\n\n"
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// cardMemory is what nvidia-smi says of the card's memory with a set's servers loaded:
// in use of the total, and by server where it names their processes (a server's
// runners are its descendants).
func cardMemory(ctx context.Context, servers map[string]*server, subjects []string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nvidia-smi", "--query-gpu=name,memory.used,memory.total",
		"--format=csv,noheader,nounits").Output()
	if err != nil {
		return fmt.Sprintf("unknown (nvidia-smi: %v)", err)
	}
	f := strings.Split(strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0], ",")
	if len(f) < 3 {
		return fmt.Sprintf("unknown (nvidia-smi said %q)", out)
	}
	used, _ := strconv.ParseFloat(strings.TrimSpace(f[1]), 64)
	total, _ := strconv.ParseFloat(strings.TrimSpace(f[2]), 64)
	s := fmt.Sprintf("%s, %.1f of %.1f GiB in use", strings.TrimSpace(f[0]), used/1024, total/1024)

	out, err = exec.CommandContext(ctx, "nvidia-smi", "--query-compute-apps=pid,used_memory",
		"--format=csv,noheader,nounits").Output()
	if err != nil {
		return s
	}
	by := map[string]float64{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		pid, mib, ok := strings.Cut(line, ",")
		p, err1 := strconv.Atoi(strings.TrimSpace(pid))
		m, err2 := strconv.ParseFloat(strings.TrimSpace(mib), 64)
		if !ok || err1 != nil || err2 != nil {
			continue
		}
		if name := ownerOf(p, servers); name != "" {
			by[name] += m
		}
	}
	if len(by) == 0 {
		return s + " (nvidia-smi names no process of the servers)"
	}
	parts := make([]string, len(subjects))
	for i, name := range subjects {
		parts[i] = fmt.Sprintf("%s %.1f GiB", name, by[name]/1024)
		if by[name] == 0 {
			parts[i] = name + " none"
			say("warning: %s holds no memory on the card", name)
		}
	}
	return s + "; " + strings.Join(parts, ", ")
}

// ownerOf is the name of the server whose process is pid or one of its ancestors.
func ownerOf(pid int, servers map[string]*server) string {
	for range 32 {
		for name, s := range servers {
			if s.cmd.Process != nil && s.cmd.Process.Pid == pid {
				return name
			}
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return ""
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		rest := string(stat[strings.LastIndexByte(string(stat), ')')+1:])
		f := strings.Fields(rest)
		if len(f) < 2 {
			return ""
		}
		if pid, err = strconv.Atoi(f[1]); err != nil || pid <= 1 {
			return ""
		}
	}
	return ""
}
