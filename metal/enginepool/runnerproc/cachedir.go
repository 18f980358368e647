package runnerproc

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/macfleet/macfleet/metal/enginepool"
)

// The SSD tier of a runner's prompt cache lives in a directory of its own under
// ProcessConfig.PromptCacheDir, named <namespace>_<id>: the tenant the model serves
// (ModelSpec.Namespace) and a stable id of the model file — the blob name
// sha256-<hex> of a file in the agent's model store, else the file's name and a hash
// of its absolute path. A restarted agent (or a reloaded model) therefore finds the
// states its predecessor saved for the same tenant, and no other tenant's: two teams
// serving the same file never restore each other's prompts. Every runner of the same
// tenant and file on this agent (the replicas of a model, an adopted runner and a new
// one) shares that one directory: each restores what the others saved, and each gets
// the whole quota, which bounds the directory because a runner's evictions work on
// the directory's real contents (metal/enginepool/promptcache, ssd_shared.go). The runner
// keeps the states of each engine format in a subdirectory and counts every other
// file of its directory toward its quota and evicts it first, so runners of the same
// file in other formats or context settings share the quota too. Only a runner
// starting while the janitor is removing the directory gets another one,
// <namespace>_<id>~2 (~3, ...: the lowest index not being removed); agents before
// the shared directory gave every further runner of a file such an index, and an
// adopted runner keeps the one it has.
//
// Directories named by the model file alone (<id>, before namespaces) are never
// reused: the janitor removes them once idle for the retention.

// DefaultNamespace is the namespace of a model without one: `macfleet serve`, whose
// models all belong to the Mac's owner.
const DefaultNamespace = "local"

// PromptCacheDirName is the name of the SSD directory (before any ~N index) of the
// runners of the model file path that serve namespace.
func PromptCacheDirName(namespace, path string) string {
	if namespace == "" {
		namespace = DefaultNamespace
	}
	return namespace + "_" + PromptCacheModelID(path)
}

// maxCacheIDName bounds the file-name part of a path-derived cache id.
const maxCacheIDName = 64

// PromptCacheModelID is the stable id of a model file that names its prompt cache
// directory.
func PromptCacheModelID(path string) string {
	base := filepath.Base(path)
	if h, ok := strings.CutPrefix(base, "sha256-"); ok && len(h) == 64 && isLowerHex(h) {
		return base
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	sum := sha256.Sum256([]byte(abs))
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			return r
		}
		return '_'
	}, strings.TrimSuffix(base, filepath.Ext(base)))
	if len(name) > maxCacheIDName {
		name = name[:maxCacheIDName]
	}
	if name == "" || name[0] == '.' {
		name = "model" + name
	}
	return name + "-" + hex.EncodeToString(sum[:6])
}

func isLowerHex(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// promptCacheSSDQuota is the SSD quota a runner of spec gets: 0 means no SSD tier.
func (f *ProcessFactory) promptCacheSSDQuota(spec enginepool.ModelSpec) int64 {
	agent := f.cfg.PromptCacheSSDBytes
	pc := spec.PromptCache
	if !pc.Enabled || f.cfg.PromptCacheDir == "" || agent <= 0 || pc.SSDBytes < 0 {
		return 0
	}
	if pc.SSDBytes > 0 {
		return min(pc.SSDBytes, agent)
	}
	return agent
}

// claimCacheDir reserves the SSD directory of a runner of spec, the one every runner
// of its namespace and file shares (unless the janitor is removing it: see above);
// "" when it has no SSD tier. releaseCacheDir gives it back once the runner is gone.
func (f *ProcessFactory) claimCacheDir(spec enginepool.ModelSpec) string {
	if f.promptCacheSSDQuota(spec) == 0 {
		return ""
	}
	base := f.cacheDirBase(spec)
	f.claimMu.Lock()
	defer f.claimMu.Unlock()
	for i := 1; ; i++ {
		dir := base
		if i > 1 {
			dir = base + "~" + strconv.Itoa(i)
		}
		if !f.pruning[dir] {
			f.cacheDirs[dir]++
			return dir
		}
	}
}

// cacheDirBase is the SSD directory of spec's model file before any index; "" when
// it has no SSD tier.
func (f *ProcessFactory) cacheDirBase(spec enginepool.ModelSpec) string {
	if f.promptCacheSSDQuota(spec) == 0 {
		return ""
	}
	return filepath.Join(f.cfg.PromptCacheDir, PromptCacheDirName(spec.Namespace, spec.Path))
}

// claimCacheDirExact marks dir as held by an adopted runner too.
func (f *ProcessFactory) claimCacheDirExact(dir string) {
	f.claimMu.Lock()
	defer f.claimMu.Unlock()
	f.cacheDirs[dir]++
}

// releaseCacheDir gives back one runner's hold of dir.
func (f *ProcessFactory) releaseCacheDir(dir string) {
	if dir == "" {
		return
	}
	f.claimMu.Lock()
	defer f.claimMu.Unlock()
	if f.cacheDirs[dir] <= 1 {
		delete(f.cacheDirs, dir)
		return
	}
	f.cacheDirs[dir]--
}

// promptCacheArgs are the runner's prompt cache flags for spec with its SSD
// directory (see claimCacheDir). The hot budget is not among them: a runner starts
// with none and the pool hands it a share once it is ready (so the flags, which the
// adoption fingerprint covers, do not depend on what else is loaded).
func (f *ProcessFactory) promptCacheArgs(spec enginepool.ModelSpec, dir string) []string {
	if dir == "" {
		return nil
	}
	return []string{"--prompt-cache-dir", dir, "--prompt-cache-ssd-bytes", strconv.FormatInt(f.promptCacheSSDQuota(spec), 10)}
}
