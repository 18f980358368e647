// Package devicegauge reads the memory of a machine's accelerators that have memory of
// their own (a discrete card), as their driver counts it: every process together. On a
// Mac the GPU computes in unified memory, which the host's gauges already measure, and
// there is nothing to read here.
//
// The reading comes from the driver's own tool (nvidia-smi for NVIDIA cards), so that
// the agent stays a pure Go program that never opens the device itself: a process that
// opens a CUDA device holds hundreds of MiB of it for as long as it lives.
package devicegauge

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Card is one accelerator with memory of its own.
type Card struct {
	// Index is the driver's index of the card.
	Index int `json:"index"`
	// Name is the card's name (NVIDIA H100 80GB HBM3).
	Name string `json:"name"`
	// TotalBytes and UsedBytes are the card's memory and what every process holds of it.
	TotalBytes int64 `json:"totalBytes"`
	UsedBytes  int64 `json:"usedBytes"`
}

// Gauge reads the cards of this machine.
type Gauge interface {
	// Cards lists the cards; none (and no error) on a machine without any.
	Cards(ctx context.Context) ([]Card, error)
}

// ErrNoTool means the driver's tool is not installed: the machine has no such card.
var ErrNoTool = errors.New("no accelerator driver tool (nvidia-smi) on the PATH")

// NVIDIA reads NVIDIA cards through nvidia-smi.
type NVIDIA struct {
	// Path is the tool; empty looks it up on the PATH.
	Path string
	// Timeout bounds one reading (default 5 s: the tool answers in tens of ms, but a
	// wedged driver can hang it).
	Timeout time.Duration
}

// query asks for one CSV line per card, in MiB.
var query = []string{"--query-gpu=index,name,memory.total,memory.used", "--format=csv,noheader,nounits"}

// Cards runs the tool once.
func (n NVIDIA) Cards(ctx context.Context) ([]Card, error) {
	path := n.Path
	if path == "" {
		p, err := exec.LookPath("nvidia-smi")
		if err != nil {
			return nil, ErrNoTool
		}
		path = p
	}
	timeout := n.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, query...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && len(ee.Stderr) > 0 {
			return nil, fmt.Errorf("%s: %w: %s", path, err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return Parse(string(out))
}

// Parse reads the tool's CSV answer: "index, name, total MiB, used MiB" a card.
func Parse(out string) ([]Card, error) {
	var cards []Card
	for i, line := range strings.Split(strings.TrimSpace(out), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) < 4 {
			return nil, fmt.Errorf("line %d %q: want index, name, memory.total, memory.used", i+1, line)
		}
		// A card's name holds no comma today; take the numbers from the end to be safe.
		idx, err := strconv.Atoi(strings.TrimSpace(f[0]))
		if err != nil {
			return nil, fmt.Errorf("line %d: index %q: %w", i+1, f[0], err)
		}
		total, err1 := mib(f[len(f)-2])
		used, err2 := mib(f[len(f)-1])
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("line %d %q: %w", i+1, line, err)
		}
		cards = append(cards, Card{Index: idx, Name: strings.TrimSpace(strings.Join(f[1:len(f)-2], ",")),
			TotalBytes: total, UsedBytes: used})
	}
	return cards, nil
}

func mib(s string) (int64, error) {
	s = strings.TrimSpace(s)
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("memory %q is not a whole number of MiB (a card that reports [N/A] has no memory figure)", s)
	}
	if v < 0 || v > 1<<40 {
		return 0, fmt.Errorf("memory %d MiB out of range", v)
	}
	return v << 20, nil
}

// Used is the memory every process holds on all cards together.
func Used(cards []Card) int64 {
	var n int64
	for _, c := range cards {
		n += c.UsedBytes
	}
	return n
}

// Detect is the gauge of this machine's cards: NVIDIA's where its tool is installed,
// nil elsewhere (a Mac's GPU shares the memory the host gauges measure).
func Detect() Gauge {
	if runtime.GOOS == "darwin" {
		return nil
	}
	if _, err := exec.LookPath("nvidia-smi"); err != nil {
		return nil
	}
	return NVIDIA{}
}

// Cached answers from one reading of g for every, so that a status endpoint others
// poll does not run the driver's tool on every call.
func Cached(g Gauge, every time.Duration) Gauge {
	if g == nil {
		return nil
	}
	return &cached{g: g, every: every}
}

type cached struct {
	g     Gauge
	every time.Duration
	mu    sync.Mutex
	at    time.Time
	cards []Card
	err   error
}

func (c *cached) Cards(ctx context.Context) ([]Card, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < c.every {
		return c.cards, c.err
	}
	c.cards, c.err = c.g.Cards(ctx)
	c.at = time.Now()
	return c.cards, c.err
}
