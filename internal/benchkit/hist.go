package benchkit

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// The histogram is log-linear, in the style of HDR histograms: values below
// 2*histSubBuckets get one bucket each; above that, every power of two is split
// into histSubBuckets equal buckets. The relative error of a reported quantile is
// therefore below 1/histSubBuckets (0.8 %), over the full range of int64
// nanoseconds, with a fixed array and no allocation on Record.
//
//	value (ns)              bucket index
//	0 .. 255                0 .. 255           (exact)
//	256 .. 511              256 .. 383         (width 2)
//	512 .. 1023             384 .. 511         (width 4)
//	...                     ... 128 more buckets per doubling, up to 2^63
const (
	histSubBits    = 7
	histSubBuckets = 1 << histSubBits // 128
	histBuckets    = 2*histSubBuckets + (63-histSubBits)*histSubBuckets
)

// Histogram records durations. Record is safe for concurrent use by many goroutines
// (every bucket is an atomic counter), so workers share one histogram instead of
// merging copies. The zero value is empty and ready to use.
type Histogram struct {
	counts [histBuckets]atomic.Uint64
	total  atomic.Uint64
	sumNs  atomic.Uint64
	maxNs  atomic.Int64
}

// bucketOf maps a non-negative value to its bucket index.
func bucketOf(v uint64) int {
	if v < 2*histSubBuckets {
		return int(v)
	}
	shift := bits.Len64(v) - (histSubBits + 1) // >= 1
	top := v >> uint(shift)                    // in [histSubBuckets, 2*histSubBuckets)
	return 2*histSubBuckets + (shift-1)*histSubBuckets + int(top-histSubBuckets)
}

// bucketHigh is the largest value that falls into bucket i. Quantiles report it, so
// they never understate a latency.
func bucketHigh(i int) uint64 {
	if i < 2*histSubBuckets {
		return uint64(i)
	}
	j := i - 2*histSubBuckets
	shift := j/histSubBuckets + 1
	top := uint64(j%histSubBuckets + histSubBuckets)
	return (top+1)<<uint(shift) - 1
}

// Record adds one observation. Negative durations (a clock step) count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[bucketOf(uint64(v))].Add(1)
	h.total.Add(1)
	h.sumNs.Add(uint64(v))
	for {
		m := h.maxNs.Load()
		if v <= m || h.maxNs.CompareAndSwap(m, v) {
			break
		}
	}
}

// Count is the number of observations.
func (h *Histogram) Count() uint64 { return h.total.Load() }

// Max is the largest observation, exact.
func (h *Histogram) Max() time.Duration { return time.Duration(h.maxNs.Load()) }

// Mean is the arithmetic mean, exact up to rounding; zero when empty.
func (h *Histogram) Mean() time.Duration {
	n := h.total.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sumNs.Load() / n)
}

// Quantile returns the value at quantile q in [0, 1]: the upper edge of the bucket
// holding the ceil(q*n)-th observation, capped at the exact maximum. It is zero for
// an empty histogram. Called while writers are active it returns a value from a
// near-consistent snapshot, which is what a progress line needs.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.total.Load()
	if n == 0 {
		return 0
	}
	if q < 0 {
		q = 0
	}
	if q > 1 {
		q = 1
	}
	rank := uint64(q * float64(n))
	if float64(rank) < q*float64(n) {
		rank++
	}
	if rank == 0 {
		rank = 1
	}
	maxV := uint64(h.maxNs.Load())
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			return time.Duration(min(bucketHigh(i), maxV))
		}
	}
	return time.Duration(maxV)
}

// Reset empties the histogram. It must not race with Record if the caller needs an
// exact boundary; the engine only resets between phases, after workers paused
// recording.
func (h *Histogram) Reset() {
	for i := range h.counts {
		h.counts[i].Store(0)
	}
	h.total.Store(0)
	h.sumNs.Store(0)
	h.maxNs.Store(0)
}

// Summary condenses the histogram into the figures a report prints.
func (h *Histogram) Summary() LatencySummary {
	return LatencySummary{
		Count: h.Count(),
		P50:   MillisOf(h.Quantile(0.50)),
		P90:   MillisOf(h.Quantile(0.90)),
		P99:   MillisOf(h.Quantile(0.99)),
		Max:   MillisOf(h.Max()),
		Mean:  MillisOf(h.Mean()),
	}
}

// Millis is a duration expressed in milliseconds, as a float, for reports and JSON.
type Millis float64

// MillisOf converts d to Millis.
func MillisOf(d time.Duration) Millis { return Millis(float64(d) / float64(time.Millisecond)) }

// LatencySummary is the latency part of a Result, in milliseconds.
type LatencySummary struct {
	Count uint64 `json:"count"`
	P50   Millis `json:"p50_ms"`
	P90   Millis `json:"p90_ms"`
	P99   Millis `json:"p99_ms"`
	Max   Millis `json:"max_ms"`
	Mean  Millis `json:"mean_ms"`
}
