package promptcache

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSSDSharedDirectory: two tiers of one identity on one directory (two runners of
// one model) see each other's states, and the quota bounds the directory: a save
// evicts the other's least recently used files too.
func TestSSDSharedDirectory(t *testing.T) {
	dir := t.TempDir()
	file := int64(headerSize + entrySize)
	a := openSSD(t, SSDConfig{Dir: dir, QuotaBytes: 3 * file})
	b := openSSD(t, SSDConfig{Dir: dir, QuotaBytes: 3 * file})
	if a.Dir() != b.Dir() {
		t.Fatalf("two directories: %s, %s", a.Dir(), b.Dir())
	}

	// B restores what A saved: asked for it by key, and found by a lookup at once
	// (the directory changed; B's clock does not move).
	a.Save(key(0), payload(0, entrySize))
	waitSettled(t, a)
	if data, ok := b.Load(key(0)); !ok || !bytes.Equal(data, payload(0, entrySize)) {
		t.Fatalf("B did not load A's state (hit %v)", ok)
	}
	a.Save(key(1), payload(1, entrySize))
	waitSettled(t, a)
	cb := New(nil, b)
	if depth, data, tier := cb.Longest([]Key{key(1)}); depth != 1 || tier != TierSSD || !bytes.Equal(data, payload(1, entrySize)) {
		t.Errorf("B's lookup of A's newest state: depth %d, tier %q", depth, tier)
	}

	// B saves two more: the directory holds 3 files, so its second save evicts the
	// least recently used of them, A's key 0 (B read key 1 since).
	b.Save(key(2), payload(2, entrySize))
	waitSettled(t, b)
	b.Save(key(3), payload(3, entrySize))
	st := waitSettled(t, b)
	if used, files := diskUsage(t, dir); used > 3*file || files != 3 {
		t.Errorf("the directory holds %d bytes in %d files, over its quota of %d", used, files, 3*file)
	}
	if len(filesOf(t, a, key(0))) != 0 || st.Evictions != 1 {
		t.Errorf("A's key 0 not evicted by B's save (B: %+v)", st)
	}
	// A, which still indexes key 0, sees a miss, not an error, and drops it.
	if _, ok := a.Load(key(0)); ok {
		t.Error("A hit a state B evicted")
	}
	if a.Has(key(0)) {
		t.Error("A still indexes the evicted state after its miss")
	}
	// A's next save works on the directory's real contents: B's files count.
	a.Save(key(4), payload(4, entrySize))
	waitSettled(t, a)
	if used, files := diskUsage(t, dir); used > 3*file || files != 3 {
		t.Errorf("after A's save the directory holds %d bytes in %d files, over %d", used, files, 3*file)
	}
	if st := a.Stats(); st.Bytes != 3*file || st.Entries != 3 {
		t.Errorf("A counts %d bytes in %d entries, want the directory's %d in 3", st.Bytes, st.Entries, 3*file)
	}
}

// TestSSDSharedDirectoryOpenKeepsOthersTemporaries: a tier opening a directory
// another process writes to leaves its fresh temporary files (writes in progress)
// and removes only stale ones.
func TestSSDSharedDirectoryOpenKeepsOthersTemporaries(t *testing.T) {
	dir := t.TempDir()
	a := openSSD(t, SSDConfig{Dir: dir})
	fresh := filepath.Join(a.Dir(), entryFileName(key(7), 1)+tempSuffix)
	stale := filepath.Join(a.Dir(), entryFileName(key(8), 2)+tempSuffix)
	writeForeign(t, fresh, 10, time.Now())
	writeForeign(t, stale, 10, time.Now().Add(-StaleTempAge-time.Minute))
	openSSD(t, SSDConfig{Dir: dir})
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a fresh temporary file (another process's write) was removed: %v", err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("a stale temporary file was kept: %v", err)
	}
}

// sharedHelperEnv makes the test binary a process of TestSSDSharedDirectoryProcesses.
const sharedHelperEnv = "MACFLEET_PROMPTCACHE_SHARED_HELPER"

// Shape of TestSSDSharedDirectoryProcesses: keys, their state's size, the quota in
// states, and each process's operations.
const (
	sharedKeys    = 24
	sharedSize    = 2048
	sharedQuota   = 8
	sharedOps     = 600
	sharedWriters = 3
)

// TestSSDSharedDirectoryProcesses: processes of one identity on one directory, each
// saving its own keys and loading everyone's while the quota makes them evict each
// other's files, never get a wrong or damaged state (every state names its key in
// its bytes), do hit the others' states, and leave the directory within its quota
// (plus what the others may have been writing at the last process's last save).
// Each process runs this test binary (with -race when the test has it).
func TestSSDSharedDirectoryProcesses(t *testing.T) {
	if os.Getenv(sharedHelperEnv) != "" {
		t.Skip("the helper process's own run")
	}
	dir, barrier := t.TempDir(), t.TempDir()
	procs := make([]*exec.Cmd, sharedWriters)
	outs := make([]*bytes.Buffer, sharedWriters)
	for i := range procs {
		outs[i] = &bytes.Buffer{}
		procs[i] = exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestSSDSharedDirectoryHelper$", "-test.v")
		procs[i].Env = append(os.Environ(), sharedHelperEnv+"="+dir, "MACFLEET_PROMPTCACHE_SHARED_INDEX="+strconv.Itoa(i),
			"MACFLEET_PROMPTCACHE_SHARED_BARRIER="+barrier)
		procs[i].Stdout, procs[i].Stderr = outs[i], outs[i]
		if err := procs[i].Start(); err != nil {
			t.Fatal(err)
		}
	}
	for i, p := range procs {
		if err := p.Wait(); err != nil {
			t.Errorf("process %d: %v\n%s", i, err, outs[i])
			continue
		}
		var own, others, misses int
		if _, err := fmt.Sscanf(resultLine(outs[i].String()), "RESULT own=%d others=%d misses=%d", &own, &others, &misses); err != nil {
			t.Errorf("process %d printed no result: %v\n%s", i, err, outs[i])
			continue
		}
		t.Logf("process %d: %d hits of its own states, %d of the others', %d misses", i, own, others, misses)
		if others == 0 {
			t.Errorf("process %d never restored another process's state", i)
		}
	}
	file := int64(headerSize + sharedSize)
	if used, files := diskUsage(t, dir); used > (sharedQuota+sharedWriters-1)*file {
		t.Errorf("the directory holds %d bytes in %d files, over the quota of %d states and %d being written", used, files, sharedQuota, sharedWriters-1)
	}
}

func resultLine(out string) string {
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "RESULT ") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// TestSSDSharedDirectoryHelper is one process of TestSSDSharedDirectoryProcesses.
func TestSSDSharedDirectoryHelper(t *testing.T) {
	dir := os.Getenv(sharedHelperEnv)
	if dir == "" {
		t.Skip("run by TestSSDSharedDirectoryProcesses")
	}
	me, _ := strconv.Atoi(os.Getenv("MACFLEET_PROMPTCACHE_SHARED_INDEX"))
	s, err := Open(SSDConfig{Dir: dir, Identity: testID, QuotaBytes: sharedQuota * int64(headerSize+sharedSize)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	c := New(nil, s)
	// Start together: each says it is ready and waits for the others (processes of
	// a race-enabled binary take a while to start).
	barrier := os.Getenv("MACFLEET_PROMPTCACHE_SHARED_BARRIER")
	if err := os.WriteFile(filepath.Join(barrier, strconv.Itoa(me)), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the other processes to start", func() bool {
		des, err := os.ReadDir(barrier)
		return err == nil && len(des) == sharedWriters
	})
	rng := rand.New(rand.NewPCG(uint64(me), 26))
	own, others, misses := 0, 0, 0
	for range sharedOps {
		k := rng.IntN(sharedKeys)
		if k%sharedWriters == me && rng.IntN(2) == 0 {
			if err := s.Save(key(k), payload(k, sharedSize)); err != nil {
				t.Fatalf("save: %v", err)
			}
			continue
		}
		// A lookup (Longest, the runner's path) or a load by key (a reference's state).
		var data []byte
		var ok bool
		if rng.IntN(2) == 0 {
			var depth int
			depth, data, _ = c.Longest([]Key{key(k)})
			ok = depth == 1
		} else {
			data, ok = s.Load(key(k))
		}
		switch {
		case !ok:
			misses++
		case !bytes.Equal(data, payload(k, sharedSize)):
			t.Fatalf("key %d restored a wrong or damaged state (%d bytes)", k, len(data))
		case k%sharedWriters == me:
			own++
		default:
			others++
		}
	}
	if st := s.Stats(); st.Corrupt > 0 {
		t.Errorf("%d corrupt files found", st.Corrupt)
	}
	fmt.Printf("RESULT own=%d others=%d misses=%d\n", own, others, misses)
}
