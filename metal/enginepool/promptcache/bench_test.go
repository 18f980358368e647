package promptcache

import (
	"fmt"
	"testing"
)

// BenchmarkSSDSave measures Save through the queue and the writer to a renamed file
// (MB/s), under a 512 MiB quota so eviction is part of the cost once it fills.
func BenchmarkSSDSave(b *testing.B) {
	for _, size := range []int{1 << 20, 16 << 20, 64 << 20} {
		for _, sync := range []bool{false, true} {
			b.Run(fmt.Sprintf("size=%dMiB/sync=%v", size>>20, sync), func(b *testing.B) {
				s, err := Open(SSDConfig{Dir: b.TempDir(), Identity: testID, QuotaBytes: 512 << 20, Sync: sync})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close(b.Context())
				data := payload(1, size)
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := range b.N {
					if err := s.Save(key(i), data); err != nil {
						b.Fatal(err)
					}
				}
				for st := s.Stats(); !settled(st); st = s.Stats() {
					waitWriter(s)
				}
				b.StopTimer()
				if st := s.Stats(); st.SavesPersisted != int64(b.N) {
					b.Fatalf("persisted %d of %d: %+v", st.SavesPersisted, b.N, st)
				}
			})
		}
	}
}

// BenchmarkSSDLoad measures Load (read + checksum) of files in the page cache
// ("warm") and, on Linux, with the file's pages dropped first ("cold": from the disk).
func BenchmarkSSDLoad(b *testing.B) {
	for _, size := range []int{1 << 20, 16 << 20, 64 << 20} {
		for _, cold := range []bool{false, true} {
			b.Run(fmt.Sprintf("size=%dMiB/cold=%v", size>>20, cold), func(b *testing.B) {
				if cold && !canDropFileCache {
					b.Skip("cannot drop a file's pages on this OS")
				}
				s, err := Open(SSDConfig{Dir: b.TempDir(), Identity: testID})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close(b.Context())
				const n = 4
				for i := range n {
					s.Save(key(i), payload(i, size))
				}
				for st := s.Stats(); !settled(st); st = s.Stats() {
					waitWriter(s)
				}
				paths := make([]string, n)
				for i := range n {
					s.mu.Lock()
					paths[i] = s.entries[key(i)].path
					s.mu.Unlock()
				}
				b.SetBytes(int64(size))
				b.ResetTimer()
				for i := range b.N {
					if cold {
						b.StopTimer()
						dropFileCache(b, paths[i%n])
						b.StartTimer()
					}
					if _, ok := s.Load(key(i % n)); !ok {
						b.Fatal("miss")
					}
				}
			})
		}
	}
}

// BenchmarkBlockKeys hashes a 32k-token prompt into 256-token block keys.
func BenchmarkBlockKeys(b *testing.B) {
	toks := seq(32<<10, 1)
	b.SetBytes(int64(4 * len(toks)))
	for b.Loop() {
		if len(BlockKeys(testID, "", toks, 256)) != 128 {
			b.Fatal("wrong key count")
		}
	}
}

// waitWriter yields until the writer makes progress (benchmarks only).
func waitWriter(s *SSD) {
	s.mu.Lock()
	var done chan struct{}
	for _, items := range s.pending {
		for _, it := range items {
			done = it.done
			break
		}
		break
	}
	s.mu.Unlock()
	if done != nil {
		<-done
	}
}
