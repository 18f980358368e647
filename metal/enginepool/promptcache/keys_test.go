package promptcache

import (
	"testing"
)

func seq(n int, salt int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(i)*7 + salt
	}
	return out
}

func TestBlockKeys(t *testing.T) {
	base := seq(1000, 1)
	baseKeys := BlockKeys(testID, "", base, 256)

	tests := []struct {
		name      string
		id        Identity
		partition string
		toks      []int32
		bs        int
		// shared is how many leading keys must equal baseKeys; want how many keys.
		want, shared int
	}{
		{"same prompt", testID, "", base, 256, 3, 3},
		{"extension shares the earlier prefix", testID, "", append(seq(1000, 1), seq(600, 9)...), 256, 6, 3},
		{"partial block has no key", testID, "", base[:255], 256, 0, 0},
		{"change in block 2 keeps block 1", testID, "", append(append([]int32{}, base[:300]...), seq(400, 5)...), 256, 2, 1},
		{"change in block 1 changes every key", testID, "", append([]int32{99}, base[1:]...), 256, 3, 0},
		{"another model never shares", Identity{Model: "other", Format: testID.Format}, "", base, 256, 3, 0},
		{"another format never shares", Identity{Model: testID.Model, Format: "llama-seq-v1 kv=q8_0"}, "", base, 256, 3, 0},
		{"another block size never shares", testID, "", base, 250, 4, 0},
		{"block size below 1 is 1", testID, "", base[:5], 0, 5, 0},
		{"another partition never shares", testID, "team-a", base, 256, 3, 0},
		{"a partition named like a token never shares", testID, "\x00", base, 256, 3, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := BlockKeys(tt.id, tt.partition, tt.toks, tt.bs)
			if len(got) != tt.want {
				t.Fatalf("got %d keys, want %d", len(got), tt.want)
			}
			shared := 0
			for shared < len(got) && shared < len(baseKeys) && got[shared] == baseKeys[shared] {
				shared++
			}
			if shared != tt.shared {
				t.Errorf("shares %d leading keys with the base prompt, want %d", shared, tt.shared)
			}
			// No key repeats across depths.
			seen := map[Key]bool{}
			for _, k := range got {
				if seen[k] {
					t.Fatalf("key %s repeats", k)
				}
				seen[k] = true
			}
		})
	}
}

func TestIdentityDirName(t *testing.T) {
	a := Identity{Model: "sha256:ab/../x y", Format: "f1"}
	b := Identity{Model: "sha256:ab/../x y", Format: "f2"}
	if a.DirName() == b.DirName() {
		t.Errorf("two formats share directory %q", a.DirName())
	}
	for _, c := range a.DirName() {
		if c == '/' || c == ' ' {
			t.Errorf("directory name %q holds %q", a.DirName(), c)
		}
	}
	if got := (Identity{}).DirName(); len(got) == 0 || got[0] == '-' {
		t.Errorf("empty identity gives directory %q", got)
	}
}

func TestFileName(t *testing.T) {
	k := key(7)
	name := entryFileName(k, 0xdeadbeef)
	got, ok := parseEntryFileName(name)
	if !ok || got != k {
		t.Fatalf("parse(%q) = %v, %v", name, got, ok)
	}
	for _, bad := range []string{name + tempSuffix, "x" + name[1:], name[:64] + "_deadbeef.kvc", "notes.txt"} {
		if _, ok := parseEntryFileName(bad); ok {
			t.Errorf("parse(%q) accepted", bad)
		}
	}
}

// TestBlockKeysPartitions: within a partition a prompt finds its own prefixes; no
// key of one partition is a key of another, at any depth.
func TestBlockKeysPartitions(t *testing.T) {
	toks := seq(1024, 3)
	keys := map[string][]Key{}
	for _, p := range []string{"", "team-a", "team-b", "team-a/ci", "team-a\x00salt"} {
		keys[p] = BlockKeys(testID, p, toks, 64)
		if again := BlockKeys(testID, p, toks[:640], 64); len(again) != 10 || again[9] != keys[p][9] {
			t.Errorf("partition %q: a prefix of the prompt does not find its own keys", p)
		}
	}
	owner := map[Key]string{}
	for p, ks := range keys {
		for _, k := range ks {
			if q, ok := owner[k]; ok {
				t.Fatalf("key %s is in partitions %q and %q", k, q, p)
			}
			owner[k] = p
		}
	}
}
