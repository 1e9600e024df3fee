#pragma once
#include "common.cuh"

// Merge the splits of one (row, head): lse = log sum_s exp(lse_s); o = sum_s exp(lse_s - lse) o_s,
// times the sink factor; lse = +inf and o = 0 when no split saw a valid entry. grid (h, rows), 128 threads,
// each owning 4 of the 512 output dims.
// Latency, not bandwidth, sets this kernel's time at small batch (a few KB per CTA): it reads the splits
// kBatch at a time with every load of a batch issued before any is used, and merges each batch into
// a running maximum, so a call waits for ceil(splits / kBatch) round trips to L2. (Reading the
// maximum first and then, per split, its lse and, only if non-empty, its partial cost two dependent round
// trips per split: ~2x32 for V3.2 at one row.) An empty split's partial is never written: it is loaded but
// selected away, never multiplied, so stale bytes there cannot turn into NaN.
// Launched behind the main kernel with programmatic stream serialization: the grid is scheduled while the
// main kernel drains and waits here until the main kernel's partials are visible.
// kBatch splits per round trip: 16 (one round trip for V4 CSA at one row, 10 splits; two for V3.2, 32) costs ~112
// registers, so four 128-thread CTAs per SM; 8 (sparse_mla_combine_b8, which the launcher takes for at most 8 splits)
// fits more CTAs per SM, so that the larger grids of many rows run in fewer waves.
// kTl (tuning build): entry, past the wait and exit times (globaltimer) of each CTA into p.counters from word
// kCombineTlBase on (kernels/tuning/probe_first_timeline.py).
template <int kBatch, bool kTl = false>
__device__ __forceinline__ void combine_body(const MlaParams& p) {
  unsigned long long* tl = kTl ? reinterpret_cast<unsigned long long*>(p.counters) + kCombineTlBase +
                                     kCombineTlWords * (blockIdx.x + gridDim.x * blockIdx.y)
                               : nullptr;
  if (kTl && threadIdx.x == 0) tl[0] = globaltimer_ns();
  const int head = blockIdx.x, row = blockIdx.y, tid = threadIdx.x;
  // The sink is an input of the call, not the main kernel's output: read it before the wait, so that its round trip
  // (DRAM, in a server the rest of the step has evicted it) overlaps the main kernel instead of following the
  // partials' (ncu at one row: 9% of the combine's stall samples waited for it after the merge; NOTES.md "One row:
  // where a split CTA's time goes").
  const float sink = p.sinks ? p.sinks[head] : 0.f;
  griddep_wait();
  if (kTl && threadIdx.x == 0) tl[1] = globaltimer_ns();
  const size_t base = static_cast<size_t>(row) * p.splits * p.h + head;
  float m = -INFINITY, wsum = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = 0; s0 < p.splits; s0 += kBatch) {
    float l[kBatch];
    float4 o[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {   // predicated, independent loads: all in flight at once
      l[j] = -INFINITY;
      o[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (s0 + j < p.splits) {
        const size_t b = base + static_cast<size_t>(s0 + j) * p.h;
        l[j] = p.lse_part[b];
        o[j] = reinterpret_cast<const float4*>(p.o_part + b * kDv)[tid];
      }
    }
    float mb = m;
#pragma unroll
    for (int j = 0; j < kBatch; ++j) mb = fmaxf(mb, l[j]);
    if (mb == -INFINITY) continue;                 // no valid entry so far
    const float r = __expf(m - mb);                  // rescale what was merged before (0 while m = -inf)
    wsum *= r;
    acc.x *= r;
    acc.y *= r;
    acc.z *= r;
    acc.w *= r;
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (l[j] == -INFINITY) continue;             // empty split (or past the end): its partial is unwritten
      const float w = __expf(l[j] - mb);
      wsum += w;
      acc.x += w * o[j].x;
      acc.y += w * o[j].y;
      acc.z += w * o[j].z;
      acc.w += w * o[j].w;
    }
    m = mb;
  }
  float lse = INFINITY, f = 0.f;
  if (m != -INFINITY) {
    lse = m + __logf(wsum);
    f = __fdividef(1.f, wsum);
    if (p.sinks) f = __fdividef(f, 1.f + __expf(sink - lse));
  }
  uint2 v;
  v.x = pack_bf16(acc.x * f, acc.y * f);
  v.y = pack_bf16(acc.z * f, acc.w * f);
  reinterpret_cast<uint2*>(p.out + (static_cast<size_t>(row) * p.h + head) * kDv)[tid] = v;
  if (tid == 0) p.lse[static_cast<size_t>(row) * p.h + head] = lse;
  if (kTl && threadIdx.x == 0) tl[2] = globaltimer_ns();
}
