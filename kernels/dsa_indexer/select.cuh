#pragma once
// DSA lightning indexer: the selection family, the split path's second launch (dsa_select, dsa_select_early,
// dsa_select_cluster; one body, select_body, with the EARLY and CLUSTER flags), and the thread-block cluster
// primitives the cluster variant uses. Instantiated by dsa_indexer.cu from DSA_SELECT_KERNELS (dsa_indexer.h).
#include "common.cuh"

static __device__ __forceinline__ float f4get(const float4& v, int e) {
  return e == 0 ? v.x : (e == 1 ? v.y : (e == 2 ? v.z : v.w));
}

// Thread-block cluster primitives (sm_90+): the address of `p` (this CTA's shared memory) in CTA `rank`'s shared
// memory, atomics and stores there, and the cluster barrier's two halves (every thread of every CTA executes them).
__device__ __forceinline__ uint32_t cluster_map(const void* p, uint32_t rank) {
  uint32_t d;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(smem_u32(p)), "r"(rank));
  return d;
}
__device__ __forceinline__ unsigned long long cluster_add_u64(uint32_t addr, unsigned long long v) {
  unsigned long long old;
  asm volatile("atom.shared::cluster.add.u64 %0, [%1], %2;\n" : "=l"(old) : "r"(addr), "l"(v) : "memory");
  return old;
}
__device__ __forceinline__ void cluster_store_u2(uint32_t addr, uint2 v) {
  asm volatile("st.shared::cluster.v2.u32 [%0], {%1, %2};\n" ::"r"(addr), "r"(v.x), "r"(v.y) : "memory");
}
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory"); }

// EARLY variant of reserve_slots: both counters in one 64-bit atomic (ctr[0] sure, low word; ctr[1] tied, high
// word; neither count can carry into the other), so one round trip instead of two in flight. Also returns this
// CTA's total of tied positions (cta_ties, every thread), which the done counter accumulates (select_body).
// kCluster: the counter is cluster_ctr, rank 0's shared-memory word (a shared::cluster address), not ctr[0..1].
template <int NT, bool kCluster>
__device__ __forceinline__ void reserve_slots64(int n_sure, int n_tie, int tid, int* ctr, uint32_t cluster_ctr,
                                                unsigned long long* s_warp64, int* s_misc, int& ps, int& pt,
                                                int& cta_ties) {
  unsigned long long total = 0;
  const unsigned long long mine =
      static_cast<unsigned long long>(n_sure) | (static_cast<unsigned long long>(n_tie) << 32);
  const unsigned long long excl = block_excl_scan<NT, unsigned long long>(mine, s_warp64, &total);
  if constexpr (kCluster) cluster_wait();   // rank 0 has zeroed the counter (its arrive is at the kernel's start)
  if (tid == 0) {
    unsigned long long base = 0;
    if (total) {
      base = kCluster ? cluster_add_u64(cluster_ctr, total)
                      : atomicAdd(reinterpret_cast<unsigned long long*>(ctr), total);
    }
    s_misc[0] = static_cast<int>(base & 0xFFFFFFFFull);
    s_misc[1] = static_cast<int>(base >> 32);
  }
  __syncthreads();
  ps = s_misc[0] + static_cast<int>(excl & 0xFFFFFFFFull);
  pt = s_misc[1] + static_cast<int>(excl >> 32);
  cta_ties = static_cast<int>(total >> 32);
}

// The split path's second launch. EARLY (dsa_select_early) takes four dependent global round trips off the
// chain at small batch: the lengths are read (and short rows written) before griddepcontrol.wait; tied scores
// are re-read from the ring in shared memory instead of L2 when the CTA's sub-chunks all fit in it; the two
// reservations are one 64-bit atomic; and the done counter (a 64-bit atomic on ctr[2] | ctr[3] << 32 that also
// sums the tied counts) hands the last CTA the row's number of tied candidates, which the base kernel reloads
// from ctr[1] after it. The last CTA also zeroes the row's histogram before the resolve rather than after.
// CLUSTER (dsa_select_cluster, launched with one cluster of gridDim.x <= kClusterMax CTAs per row, so the rank is
// blockIdx.x; select_subs <= kClusterSubs): EARLY, plus no global atomics at all. The row's reservation counter
// and tied candidates live in rank 0's shared memory (a distributed-shared-memory atomic and stores instead of
// global ones; candidates past kClusterCand go to the global list), and the cluster barrier replaces the fence and
// the done counter; rank 0 then resolves from its own shared memory. The row's counters in ctr stay untouched.
template <bool kEarly, bool kCluster>
__device__ __forceinline__ void select_body(const DsaParams& p) {
  static_assert(kEarly || !kCluster, "the cluster variant builds on the early one");
  constexpr int kPerThread = kSelectChunk / kSelectThreads;   // 16 scores, as 4 float4
  static_assert(kSelectSmem == kSelectRing * (kPerThread / 4) * kSelectThreads * 16, "s_ring is kSelectSmem");
  static_assert(kClusterCandOffset == kClusterSubs * (kPerThread / 4) * kSelectThreads * 16, "ring, then candidates");
  __shared__ int s_hist[kBins2];
  __shared__ uint32_t s_mask[kCluster ? kClusterSubs : kMaxSubs][kSelectThreads];   // sure bits | tie bits << 16
  extern __shared__ float4 s_ring[];   // kSelectRing x 4 x 256 float4: this thread's scores, in flight
  __shared__ int s_warp[kSelectThreads / 32];
  __shared__ int s_res[2];
  __shared__ int s_misc[4];
  __shared__ unsigned long long s_warp64[kSelectThreads / 32];

  tl_stamp(kTlSelect, 0);
  if constexpr (!kEarly) griddep_wait();   // everything below reads what the scoring grid wrote
  const int row = blockIdx.y;
  const int b = row / p.next_n, j = row - b * p.next_n;
  const int len = row_len(p, b, j);   // an input: EARLY reads it while the scoring grid still runs
  const int K = p.topk;
  const int tid = threadIdx.x;
  int* out = p.out + static_cast<size_t>(row) * K;

  if (len <= K) {   // every position is selected: 0..len-1, then -1 padding (needs nothing from scoring)
    const int per = (K + gridDim.x - 1) / gridDim.x;
    const int lo = blockIdx.x * per, hi = min(K, lo + per);
    for (int i = lo + tid; i < hi; i += kSelectThreads) out[i] = i < len ? i : -1;
    return;   // CLUSTER: the whole row, so the whole cluster, leaves here, before any cluster access
  }
  // CLUSTER: rank 0's candidates and reservation counter, as shared::cluster addresses (valid in every CTA).
  uint2* s_ccand = reinterpret_cast<uint2*>(reinterpret_cast<uint8_t*>(s_ring) + kClusterCandOffset);
  unsigned long long* s_cctr = reinterpret_cast<unsigned long long*>(reinterpret_cast<uint8_t*>(s_ring) +
                                                                     kClusterCounterOffset);
  uint32_t ccand0 = 0, cctr0 = 0;
  if constexpr (kCluster) {
    ccand0 = cluster_map(s_ccand, 0);
    cctr0 = cluster_map(s_cctr, 0);
    if (blockIdx.x == 0 && tid == 0) *s_cctr = 0ull;
    cluster_arrive();   // rank 0's counter is zero and every CTA has started (waited on in reserve_slots64)
  }
  if constexpr (kEarly) griddep_wait();
  tl_stamp(kTlSelect, 1);

  int* ctr = p.ctr + static_cast<size_t>(row) * kCtr;
  int* gh1 = p.ghist + static_cast<size_t>(row) * kBins1;
  uint2* cand = p.cand + static_cast<size_t>(row) * p.len_stride;
  const float* srow = p.scores + static_cast<size_t>(row) * p.len_stride;

  // This CTA covers select_subs sub-chunks of 4096 scores, streamed through a cp.async ring (each
  // thread reads back only what it loaded, so no barrier is needed). Pass 1 classifies them against
  // T1 into bit masks; one block scan and one global atomic per counter place every output; pass 2
  // writes them.
  const int n_sub = p.select_subs;
  const int span = blockIdx.x * n_sub * kSelectChunk;
  auto issue = [&](int sub) {
    if (sub < n_sub) {
      const int base = span + sub * kSelectChunk;
      float4* slot = s_ring + (sub % kSelectRing) * (kPerThread / 4) * kSelectThreads;
#pragma unroll
      for (int it = 0; it < kPerThread / 4; ++it) {
        const int s4 = base + (it * kSelectThreads + tid) * 4;
        if (s4 < len) cp_async16(smem_u32(slot + it * kSelectThreads + tid), srow + s4);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int k = 0; k < kSelectRing - 1; ++k) issue(k);

  // Threshold bin T1 of the row (every CTA of the row finds the same one) while the scores stream in.
  row_threshold<kSelectThreads>(gh1, tid, K, s_warp, s_res);   // 16 bins per thread
  const uint32_t T1 = static_cast<uint32_t>(s_res[0]);
  const int above1 = s_res[1];
  const uint32_t lo1 = T1 << 20;
  tl_stamp(kTlSelect, 2, T1);   // the histogram read and scanned

  int n_sure = 0, n_tie_mine = 0;
  for (int sub = 0; sub < n_sub; ++sub) {
    issue(sub + kSelectRing - 1);
    cp_async_wait<kSelectRing - 1>();
    const int base = span + sub * kSelectChunk;
    const float4* slot = s_ring + (sub % kSelectRing) * (kPerThread / 4) * kSelectThreads;
    uint32_t m = 0;
    const bool full = base + kSelectChunk <= len;   // uniform: skip the per-element length test
#pragma unroll
    for (int it = 0; it < kPerThread / 4; ++it) {
      const float4 v = slot[it * kSelectThreads + tid];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t d = ord_key(f4get(v, e)) - lo1;   // bin > T1 <=> d >= 2^20 (no wrap: lo1 <= key)
        const bool valid = full || base + (it * kSelectThreads + tid) * 4 + e < len;
        const bool ge = ord_key(f4get(v, e)) >= lo1;
        m |= static_cast<uint32_t>(valid && ge && d >= (1u << 20)) << (it * 4 + e);
        m |= static_cast<uint32_t>(valid && ge && d < (1u << 20)) << (16 + it * 4 + e);
      }
    }
    s_mask[sub][tid] = m;
    n_sure += __popc(m & 0xFFFFu);
    n_tie_mine += __popc(m >> 16);
  }
  tl_stamp(kTlSelect, 3, n_sure);   // every score classified
  int ps, pt, cta_ties = 0;
  if constexpr (kEarly) {
    reserve_slots64<kSelectThreads, kCluster>(n_sure, n_tie_mine, tid, ctr, cctr0, s_warp64, s_misc, ps, pt,
                                              cta_ties);
  } else {
    reserve_slots<kSelectThreads>(n_sure, n_tie_mine, tid, ctr, s_warp64, s_misc, ps, pt);
  }
  tl_stamp(kTlSelect, 4, ps);   // output slots reserved
  // EARLY: with every sub-chunk still in the ring (none was overwritten), tied scores come from shared memory.
  const bool ring_holds_all = kEarly && n_sub <= kSelectRing;
  // CLUSTER writes in two passes: the tied candidates, then the barrier's release, then the sure positions. Rank 0's
  // resolve needs every CTA's candidates, not its outputs, and a release waits for all of the thread's earlier
  // stores to land (ncu at B=1 L=128K: the barrier's fence was 5% of the kernel's stall samples with the outputs
  // before it; NOTES.md "Requests that queued behind others").
  constexpr int kPasses = kCluster ? 2 : 1;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass) {
    const uint32_t which = !kCluster ? 0xFFFFFFFFu : (pass == 0 ? 0xFFFF0000u : 0x0000FFFFu);
    for (int sub = 0; sub < n_sub; ++sub) {
      uint32_t m = s_mask[sub][tid] & which;
      const int base = span + sub * kSelectChunk;
      while (m) {
        const int bit = __ffs(m) - 1;
        m &= m - 1;
        const int eb = bit & 15;
        const int s = base + ((eb >> 2) * kSelectThreads + tid) * 4 + (eb & 3);
        if (bit < 16) {
          out[ps++] = s;
        } else {   // rare: the score's low bits, from the ring or re-read from L2
          const float v = ring_holds_all
                              ? f4get(s_ring[(sub % kSelectRing) * (kPerThread / 4) * kSelectThreads +
                                             (eb >> 2) * kSelectThreads + tid],
                                      eb & 3)
                              : __ldcg(srow + s);
          const uint2 e = make_uint2(ord_key(v), static_cast<uint32_t>(s));
          if constexpr (kCluster) {   // into rank 0's shared memory while it has room
            if (pt < kClusterCand) cluster_store_u2(ccand0 + pt * 8, e);
            else cand[pt] = e;
            ++pt;
          } else {
            cand[pt++] = e;
          }
        }
      }
    }
    if (kCluster && pass == 0) cluster_arrive();
  }
  tl_stamp(kTlSelect, 5);   // outputs and candidates issued
  if constexpr (!kCluster) {
    __threadfence();
    __syncthreads();
  }
  int n_tie = 0;   // EARLY: the row's tied count, from the done counter (CLUSTER: from rank 0's counter)
  if constexpr (kCluster) {
    cluster_wait();   // every CTA's candidates are written (release / acquire at cluster scope)
    tl_stamp(kTlSelect, 6);
    if (blockIdx.x != 0) return;   // only rank 0's shared memory is ever accessed remotely, and no longer
    n_tie = static_cast<int>(*reinterpret_cast<volatile unsigned long long*>(s_cctr) >> 32);
    tl_value(kTlSelect, 15, n_tie);
  } else if constexpr (kEarly) {
    if (tid == 0) {
      const unsigned long long prior = atomicAdd(reinterpret_cast<unsigned long long*>(&ctr[2]),
                                                 1ull | (static_cast<unsigned long long>(cta_ties) << 32));
      s_misc[2] = static_cast<int>(prior & 0xFFFFFFFFull) == static_cast<int>(gridDim.x) - 1;
      s_misc[3] = static_cast<int>(prior >> 32) + cta_ties;   // the row's tied count, when this CTA is last
    }
    __syncthreads();
    if (!s_misc[2]) return;
    n_tie = s_misc[3];
  } else {
    if (tid == 0) s_misc[2] = (atomicAdd(&ctr[2], 1) == static_cast<int>(gridDim.x) - 1);
    __syncthreads();
    if (!s_misc[2]) return;
  }
  if constexpr (!kCluster) __threadfence();

  // Last CTA of the row: resolve the threshold bin exactly on the remaining 20 bits (10 + 10), from
  // shared memory when the candidates fit (the usual case: ~1% of the row), else from global memory.
  if constexpr (kEarly) {
    // Every CTA of the row has read the histogram and counted itself done: leave them zeroed for the next
    // call now, so the stores drain during the resolve (which reads neither).
    for (int i = tid; i < kBins1; i += kSelectThreads) gh1[i] = 0;
    if (!kCluster && tid < kCtr) ctr[tid] = 0;
  }
  cp_async_wait<0>();
  __syncthreads();   // the score ring is idle: reuse it for the candidates
  tl_stamp(kTlSelect, 7);
  // CLUSTER: rank 0 holds the candidates unless there are more than kClusterCand (the rest are in the global list
  // already): then its part moves there too, and the resolve goes as the early kernel's does (through the ring and
  // the candidates' space, or from global memory).
  const bool preloaded = kCluster && n_tie <= kClusterCand;
  if (kCluster && !preloaded) {
    for (int i = tid; i < kClusterCand; i += kSelectThreads) cand[i] = s_ccand[i];
    __syncthreads();
  }
  resolve_ties<kSelectThreads>(out, cand, kEarly ? n_tie : __ldcg(&ctr[1]), K - above1, above1,
                               preloaded ? s_ccand : reinterpret_cast<uint2*>(s_ring), s_hist, s_warp, s_res, s_misc,
                               preloaded);
  if constexpr (!kEarly) {   // leave the row's workspace zeroed for the next call
    for (int i = tid; i < kBins1; i += kSelectThreads) gh1[i] = 0;
    if (tid < kCtr) ctr[tid] = 0;
  }
  tl_stamp(kTlSelect, 8);   // the tied candidates resolved
}
