package engine

import (
	"bytes"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"
	"unsafe"
)

// median of a sample (the mean of the middle two for an even count); 0 when empty.
func median[T ~int64 | ~float64](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// percentile is the nearest-rank p-th percentile (0 < p ≤ 100); 0 when empty.
func percentile(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// bandwidth measures this machine's memory bandwidth on a 1 GiB buffer, by default
// with as many goroutines as GOMAXPROCS (the CPUs): the best of several sequential
// reads of the whole buffer, and the best of several copies of one half onto the other
// (bytes read plus bytes written, as STREAM counts them). Bytes per second.
type bandwidth struct {
	buf     []uint64
	workers int
	sink    []uint64 // per-worker sums, so the reads are not optimised away
}

const bandwidthBufBytes = 1 << 30

func newBandwidth() *bandwidth {
	buf := make([]uint64, bandwidthBufBytes/8)
	for i := range buf { // fault every page in before timing; no zero byte anywhere
		buf[i] = uint64(i) | 0x0101010101010101
	}
	w := runtime.GOMAXPROCS(0)
	return &bandwidth{buf: buf, workers: w, sink: make([]uint64, max(w, 1))}
}

// parallel runs f on workers contiguous, cache-line-aligned parts of n words.
func (bw *bandwidth) parallel(workers, n int, f func(w, lo, hi int)) time.Duration {
	per := (n/workers + 7) &^ 7
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		lo, hi := min(w*per, n), min((w+1)*per, n)
		wg.Go(func() { f(w, lo, hi) })
	}
	wg.Wait()
	return time.Since(start)
}

// read returns the best read bandwidth of passes passes by workers goroutines, each
// pass reading the buffer twice: with scalar loads (sumWords) and with the vector loads
// of bytes.IndexByte (the buffer holds no zero byte, so it scans everything).
func (bw *bandwidth) read(passes, workers int) float64 {
	bytesView := unsafe.Slice((*byte)(unsafe.Pointer(&bw.buf[0])), len(bw.buf)*8)
	best := 0.0
	for range passes {
		d := bw.parallel(workers, len(bw.buf), func(w, lo, hi int) { bw.sink[w] += sumWords(bw.buf[lo:hi]) })
		best = max(best, float64(len(bw.buf)*8)/d.Seconds())
		d = bw.parallel(workers, len(bw.buf), func(w, lo, hi int) {
			if i := bytes.IndexByte(bytesView[lo*8:hi*8], 0); i >= 0 {
				bw.sink[w] += uint64(i)
			}
		})
		best = max(best, float64(len(bw.buf)*8)/d.Seconds())
	}
	return best
}

// copy returns the best copy bandwidth (read + written) of passes passes.
func (bw *bandwidth) copy(passes int) float64 {
	half := len(bw.buf) / 2
	best := 0.0
	for range passes {
		d := bw.parallel(bw.workers, half, func(_, lo, hi int) { copy(bw.buf[lo:hi], bw.buf[half+lo:half+hi]) })
		best = max(best, float64(2*half*8)/d.Seconds())
	}
	return best
}

// sumWords reads every word of s with eight independent accumulators, so the loop is
// bound by memory, not by the add chain.
func sumWords(s []uint64) uint64 {
	var a0, a1, a2, a3, a4, a5, a6, a7 uint64
	for len(s) >= 8 {
		v := s[:8:8]
		a0 += v[0]
		a1 += v[1]
		a2 += v[2]
		a3 += v[3]
		a4 += v[4]
		a5 += v[5]
		a6 += v[6]
		a7 += v[7]
		s = s[8:]
	}
	for _, x := range s {
		a0 += x
	}
	return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7
}
