//go:build cgo && !race

package server

import (
	"context"
	"fmt"
	"net/http"

	"github.com/go-logr/logr"

	"github.com/macfleet/macfleet/api/runnerapi"
	"github.com/macfleet/macfleet/metal/enginepool/promptcache"
	"github.com/macfleet/macfleet/metal/runner/llama"
)

// cacheStore is the runner's prompt cache as the rest of the runner sees it: the
// cache of the loaded model (opened by load, nil when it could not be opened), the
// prefix table it reports on /cache/prefixes (empty without a cache), and the
// endpoints that read and change them (/cache/budget, /cache/prefixes, the peer
// states of peerstate.go).
type cacheStore struct {
	log       logr.Logger
	cfg       PromptCacheConfig
	modelPath string
	gpuLayers int
	run       *runState // the gate of its endpoints
	prefixes  *promptcache.PrefixTable

	// Set once by open, before the state becomes ready.
	pc      *promptCache // nil when it could not be opened, or is off for the model
	off     string       // why the cache is off for the model ("" when it is not)
	model   *llama.Model // aligns a prompt's text with a saved state's tokens
	slotCtx int          // the context of one slot: a longer state is refused on import
}

func newCacheStore(cfg Config, run *runState) *cacheStore {
	return &cacheStore{log: cfg.Log, cfg: cfg.PromptCache, modelPath: cfg.ModelPath, gpuLayers: cfg.GPULayers, run: run,
		prefixes: promptcache.NewPrefixTable(newEpoch())}
}

// open creates the prompt cache of the loaded model m, whose contexts hold nSeqCtx
// sequences of slotCtx tokens each, and returns it for the engines (before they run).
// A cache that cannot be opened is logged and left out (nil): the runner serves
// without it.
func (cs *cacheStore) open(m *llama.Model, kvType string, nSeqCtx, slotCtx int) *promptCache {
	cs.model, cs.slotCtx = m, slotCtx
	arch, _ := m.Meta("general.architecture")
	if cs.off = promptCacheOff(arch, m.IsRecurrent(), m.IsHybrid()); cs.off != "" {
		cs.log.Info("Serving the model without its prompt cache", "reason", cs.off)
		return nil
	}
	cfg := cs.cfg
	offload := "cpu"
	if llama.GPUCount() > 0 && cs.gpuLayers > 0 {
		offload = fmt.Sprintf("gpu%d", min(cs.gpuLayers, m.NLayer()+1))
	}
	pc, err := newPromptCache(cs.log.WithName("promptcache"), cfg, cs.modelPath, kvType, nSeqCtx, offload)
	if err != nil && cfg.Dir != "" {
		cs.log.Error(err, "The prompt cache's SSD tier is unusable; keeping the hot tier only", "dir", cfg.Dir)
		cfg.Dir = ""
		pc, err = newPromptCache(cs.log.WithName("promptcache"), cfg, cs.modelPath, kvType, nSeqCtx, offload)
	}
	if err != nil {
		cs.log.Error(err, "The prompt cache is unusable; serving without it")
		return nil
	}
	pc.prefixes = cs.prefixes
	go pc.trackPrefixes(pc.stopTracker)
	cs.pc = pc
	cs.log.Info("Prompt cache", "model", pc.id.Model, "format", pc.id.Format, "blockTokens", pc.block,
		"hotBytes", cfg.HotBytes, "ssdDir", cfg.Dir, "ssdBytes", cfg.SSDBytes)
	return pc
}

// promptCacheOff is why the prompt cache cannot serve a model of architecture arch
// ("" when it can). A restore keeps the first n tokens of a saved state, those the
// new prompt shares, and removes the rest; a recurrent state exists only at its
// sequence's last position, and llama.cpp refuses to remove part of it (it cannot
// be cut back). Every restore of a shorter prefix would fail into a full prefill
// after the state was found and copied, and every save would be work for nothing:
// the cache, and the peer states and in-flight prefixes that go through it, are off.
func promptCacheOff(arch string, recurrent, hybrid bool) string {
	switch {
	case hybrid:
		return fmt.Sprintf("off: the model keeps a recurrent state beside its attention cache, which cannot be cut back to a prefix (%s)", arch)
	case recurrent:
		return fmt.Sprintf("off: the model keeps a recurrent state, which cannot be cut back to a prefix (%s)", arch)
	}
	return ""
}

// offPaths is the /status list of the paths the runner serves the model without.
func (cs *cacheStore) offPaths() []runnerapi.PathOff {
	if cs.off == "" {
		return nil
	}
	return []runnerapi.PathOff{{Path: runnerapi.PathPromptCache, Reason: cs.off}}
}

// close releases the prefix table's long polls and flushes the SSD tier's queue (at
// most 5 s) once the engine has stopped.
func (cs *cacheStore) close() {
	cs.prefixes.Close()
	if cs.pc == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), promptcache.DefaultClearWait)
	defer cancel()
	if err := cs.pc.close(ctx); err != nil {
		cs.log.Info("The prompt cache's SSD queue was not drained", "error", err.Error())
	}
}

// handleCacheBudget is POST /cache/budget: the agent's hot-tier share for this runner.
func (cs *cacheStore) handleCacheBudget(w http.ResponseWriter, r *http.Request) {
	if _, herr := cs.run.engine(); herr != nil {
		writeError(w, herr)
		return
	}
	var b runnerapi.CacheBudget
	if err := readJSON(w, r, &b); err != nil {
		writeError(w, err)
		return
	}
	switch {
	case b.HotBytes != nil && *b.HotBytes < 0:
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "hot_bytes", "hot_bytes must not be negative"))
		return
	case b.SSDBytes != nil && *b.SSDBytes < 0:
		writeError(w, runnerapi.InvalidRequest(runnerapi.CodeInvalidValue, "ssd_bytes", "ssd_bytes must not be negative"))
		return
	case cs.pc == nil && cs.off != "":
		writeError(w, cacheOff(cs.off))
		return
	case cs.pc == nil:
		writeError(w, runnerapi.Unavailable(runnerapi.CodeInternal, "the prompt cache could not be opened (see the runner's log)"))
		return
	}
	writeJSON(w, http.StatusOK, cs.pc.setBudget(b))
}

// lookup finds a cached state for a generation's prompt (nil: none) and returns the
// tokens to generate from: when text is the prompt's text, they continue the state's
// tokens as far as the text does (see alignPrompt).
func (cs *cacheStore) lookup(text string, toks []int32, partition string) (*restoreState, []int32) {
	if cs.pc == nil {
		return nil, toks
	}
	var align func([]int32) []int32
	if text != "" {
		align = func(saved []int32) []int32 {
			return alignPrompt(cs.model, text, toks, saved, cs.model.BOS())
		}
	}
	return cs.pc.lookup(toks, partition, align)
}

// on reports whether the runner has a prompt cache.
func (cs *cacheStore) on() bool { return cs.pc != nil }

// status is the /status part (nil without a cache).
func (cs *cacheStore) status() *runnerapi.PromptCacheStatus {
	if cs.pc == nil {
		return nil
	}
	return cs.pc.status()
}

// clearHot empties the hot tier (bytes accounted, entries).
func (cs *cacheStore) clearHot() (int64, int) {
	if cs.pc == nil {
		return 0, 0
	}
	return cs.pc.clearHot()
}
