#pragma once
// DSA lightning indexer: the scoring family, dsa_score_* (the base, fused single-launch and early variants; one
// body, score_body, whose template flags pick the variant). Each CTA scores chunk_pages pages of one request for
// all next_n tokens and feeds the row histograms the selection reads; the fused kernels also run the selection
// at their tail (fused_select). Instantiated by dsa_indexer.cu from DSA_SCORE_KERNELS (dsa_indexer.h).
#include "common.cuh"

namespace {

// ---------------------------------------------------------------------------------------------
// Small-batch single launch: the selection runs at the tail of scoring, in the same grid. The launcher
// uses it only when the whole grid is co-resident (cooperative launch), so the request-wide barrier
// below cannot deadlock. Per request b with a row longer than topk:
//   1. every CTA with work (n_parts of them) publishes its histogram and scores (fence, then one
//      arrival atomic) and waits (acquire) until all n_parts have arrived;
//   2. each CTA finds T1 from the complete row histogram, classifies ITS OWN scores, kept in shared
//      memory (loc_s), reserves output space with one block scan + one atomic per counter, writes the
//      positions above T1 and appends the tied ones (bin == T1) to the candidate list;
//   3. the last CTA to finish (fence + done counter) resolves the ties of each row and leaves the
//      request's histograms and counters zeroed.
// Counters: ctr[row][0] sure, [1] ties (per row); ctr[b * NN][3] arrivals, [4] done (per request).
template <int NN>
__device__ __forceinline__ void fused_select(const DsaParams& p, int b, const int (&len)[NN], int pg0, int npg,
                                             int n_parts, const float* loc_s, int* s_hist, uint2* s_cand) {
  __shared__ int s_warp[kScoreThreads / 32];
  __shared__ unsigned long long s_warp64[kScoreThreads / 32];
  __shared__ int s_res[2];
  __shared__ int s_misc[4];
  const int K = p.topk;
  const int tid = threadIdx.x;
  bool any_long = false;
#pragma unroll
  for (int j = 0; j < NN; ++j) any_long |= len[j] > K;
  if (!any_long) return;   // outputs already written at the start
  int* bctr = p.ctr + static_cast<size_t>(b * NN) * kCtr;

  __threadfence();   // this thread's scores, candidates-to-be and histogram atomics, before the arrival
  __syncthreads();
  if (tid == 0) {
    atomicAdd(&bctr[3], 1);
    while (ld_acquire_gpu(&bctr[3]) < n_parts) {
    }
    __threadfence();
  }
  __syncthreads();

  int above[NN];
#pragma unroll
  for (int j = 0; j < NN; ++j) {
    above[j] = 0;
    if (len[j] <= K) continue;
    const int row = b * NN + j;
    int* ctr = p.ctr + static_cast<size_t>(row) * kCtr;
    const int* gh1 = p.ghist + static_cast<size_t>(row) * kBins1;
    row_threshold<kScoreThreads>(gh1, tid, K, s_warp, s_res);   // 32 bins per thread
    const uint32_t T1 = static_cast<uint32_t>(s_res[0]);
    above[j] = s_res[1];
    const float* sl = loc_s + j * p.chunk_pages * kPage;
    const int n_loc = max(0, min(npg * kPage, len[j] - pg0 * kPage));
    int n_sure = 0, n_tie = 0;
    for (int i = tid; i < n_loc; i += kScoreThreads) {
      const uint32_t bin = ord_key(sl[i]) >> 20;
      n_sure += bin > T1;
      n_tie += bin == T1;
    }
    int ps, pt;
    reserve_slots<kScoreThreads>(n_sure, n_tie, tid, ctr, s_warp64, s_misc, ps, pt);
    int* out = p.out + static_cast<size_t>(row) * K;
    uint2* cand = p.cand + static_cast<size_t>(row) * p.len_stride;
    for (int i = tid; i < n_loc; i += kScoreThreads) {
      const uint32_t key = ord_key(sl[i]);
      const uint32_t bin = key >> 20;
      const int s = pg0 * kPage + i;
      if (bin > T1) out[ps++] = s;
      else if (bin == T1) cand[pt++] = make_uint2(key, static_cast<uint32_t>(s));
    }
  }

  __threadfence();
  __syncthreads();
  if (tid == 0) s_misc[2] = (atomicAdd(&bctr[4], 1) == n_parts - 1);
  __syncthreads();
  if (!s_misc[2]) return;
  __threadfence();

  // Last CTA of the request: resolve each long row's ties, then zero the request's workspace.
#pragma unroll
  for (int j = 0; j < NN; ++j) {
    if (len[j] <= K) continue;
    const int row = b * NN + j;
    resolve_ties<kScoreThreads>(p.out + static_cast<size_t>(row) * K, p.cand + static_cast<size_t>(row) * p.len_stride,
                                __ldcg(&p.ctr[static_cast<size_t>(row) * kCtr + 1]), K - above[j], above[j], s_cand,
                                s_hist, s_warp, s_res, s_misc);
    __syncthreads();   // s_hist, s_misc and s_cand are reused by the next row
    int* gh1 = p.ghist + static_cast<size_t>(row) * kBins1;
    for (int i = tid; i < kBins1; i += kScoreThreads) gh1[i] = 0;
  }
  if (tid < NN * kCtr) bctr[tid] = 0;   // both rows' counters (rows b*NN .. b*NN+NN-1 are contiguous)
}

// ---------------------------------------------------------------------------------------------
// EARLY variant: thread t's block-table entry pg0 + t, loaded in the same round trip as the lengths (the base
// kernel's loads of the entries wait for the length). Bounded by the plan's bound (len_stride) and the table's
// width, not by the row's length: entries past the length are read, never dereferenced.
__device__ __forceinline__ int prefetch_block_id(const DsaParams& p, int b, int pg0, int tid) {
  const int bound = min(p.max_blocks, p.len_stride / kPage);
  const int* row = p.block_table + static_cast<size_t>(b) * p.max_blocks;
  return (tid < p.chunk_pages && pg0 + tid < bound) ? __ldg(row + pg0 + tid) : 0;
}

template <int NN, bool kWgmma, bool kFused, bool kEarly>
__device__ __forceinline__ void score_body(const DsaParams& p) {
  static_assert(!(kFused && kEarly), "the fused kernels keep the base pipeline");
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  uint8_t* sm = smem_raw + (((raw + 1023u) & ~1023u) - raw);   // swizzle atoms need 1024 B alignment
  using S = ScoreSmem<NN>;
  uint8_t* q_s = sm + S::kQ;                                     // NN * 8192
  uint8_t* k_s = sm + S::kKeys;                                  // kStages * 8192
  float* sc_s = reinterpret_cast<float*>(sm + S::kScales);       // kStages * 64
  // 16-bit counters, two bins per word (a CTA scores at most 65535 keys: chunk_pages <= 1023).
  uint32_t* hist_s = reinterpret_cast<uint32_t*>(sm + S::kHist);   // NN * 2048 words
  // Fused path only: this CTA's own scores, NN x chunk_pages x 64 fp32, kept for the selection.
  float* loc_s = reinterpret_cast<float*>(sm + S::kLocal);

  tl_stamp(kTlScore, 0);
  griddep_launch_dependents();
  const int b = blockIdx.y;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  // EARLY: entries of pages below kScoreThreads come from s_bt; larger chunks read the rest from global.
  // The load goes to a register first: a store to s_bt before row_len would hold the length loads back (the
  // compiler cannot move a load through a generic pointer above a shared-memory store).
  int* s_bt = reinterpret_cast<int*>(sm + S::kBlockIds);
  const int my_block_id = kEarly ? prefetch_block_id(p, b, blockIdx.x * p.chunk_pages, tid) : 0;

  int len[NN];
  int maxlen = 0;
#pragma unroll
  for (int j = 0; j < NN; ++j) {
    len[j] = row_len(p, b, j);
    maxlen = max(maxlen, len[j]);
  }
  tl_stamp(kTlScore, 1, maxlen);   // the lengths landed
  // This thread's head weights, requested with the lengths: issued after the page copies (as they were until
  // 2026-12-03), they queued behind the CTA's ~50 KB of requests and the first page's epilogue waited for them
  // (ncu at B=1 L=128K: 22% of the kernel's stall samples on their first use; NOTES.md "Requests that queued
  // behind others").
  float wr[NN][8][2];
#pragma unroll
  for (int j = 0; j < NN; ++j) {
    const float* wrow = p.weights + static_cast<size_t>(b * NN + j) * kHeads;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const float2 w2 = __ldg(reinterpret_cast<const float2*>(wrow + 8 * n + 2 * t4));
      wr[j][n][0] = w2.x;
      wr[j][n][1] = w2.y;
    }
  }
  const int n_pages = (maxlen + kPage - 1) / kPage;
  const int pg0 = blockIdx.x * p.chunk_pages;
  // Fused path: the CTAs with work for request b (at least one, so that empty rows get their -1s).
  const int n_parts = max(1, (n_pages + p.chunk_pages - 1) / p.chunk_pages);
  if constexpr (kFused) {
    // Rows of length <= topk: 0..len-1 then -1, the slots shared among the request's CTAs.
    if (static_cast<int>(blockIdx.x) < n_parts) {
      const int per = (p.topk + n_parts - 1) / n_parts;
      const int lo = blockIdx.x * per, hi = min(p.topk, lo + per);
#pragma unroll
      for (int j = 0; j < NN; ++j) {
        if (len[j] > p.topk) continue;
        int* o = p.out + static_cast<size_t>(b * NN + j) * p.topk;
        for (int i = lo + tid; i < hi; i += kScoreThreads) o[i] = i < len[j] ? i : -1;
      }
    }
  }
  if (pg0 >= n_pages) return;   // cost follows the actual length: empty CTAs leave at once
  const int npg = min(pg0 + p.chunk_pages, n_pages) - pg0;
  const int* bt = p.block_table + static_cast<size_t>(b) * p.max_blocks + pg0;
  if constexpr (kEarly) {
    s_bt[tid] = my_block_id;
    __syncthreads();   // s_bt complete (every thread of a CTA with work reaches this)
  }
  // Pages in flight: the base pipeline refills a slot one page after it is consumed (kStages - 1 ahead); EARLY
  // also fills the last slot up front, so a chunk of <= kStages pages is requested in one round trip.
  // Either way cp.async group p holds page p: the prologue commits groups 0 .. kAhead - 1, and iteration i
  // commits the group of page i + kStages - 1, except EARLY's iteration 0, whose page is in the prologue already.
  constexpr int kAhead = kEarly ? kStages : kStages - 1;

  {
    const uint8_t* qg = p.q + static_cast<size_t>(b) * NN * kHeads * kDim;
    const uint32_t qd = smem_u32(q_s);
#pragma unroll
    for (int u = 0; u < NN * 4; ++u) {
      const int c = tid + u * kScoreThreads;
      cp_async16(qd + swz(c >> 3, c & 7), qg + c * 16);
    }
  }
  for (int i = tid; i < NN * kBins1 / 2; i += kScoreThreads) hist_s[i] = 0;

  auto load_page = [&](int i, int slot) {
    const int id = (kEarly && i < kScoreThreads) ? s_bt[i] : bt[i];
    const uint8_t* blk = p.kv + static_cast<long long>(id) * kBlockBytes;
    const uint32_t dst = smem_u32(k_s + slot * kTileBytes);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int c = tid + u * kScoreThreads;
      cp_async16(dst + swz(c >> 3, c & 7), blk + c * 16);
    }
    if (tid < 16) cp_async16(smem_u32(sc_s + slot * kPage) + tid * 16, blk + kTileBytes + tid * 16);
  };
#pragma unroll
  for (int st = 0; st < kAhead; ++st) {
    if (st < npg) load_page(st, st);
    cp_async_commit();
  }

  bool want_hist[NN];
  float* srow[NN];
#pragma unroll
  for (int j = 0; j < NN; ++j) {
    want_hist[j] = len[j] > p.topk;
    srow[j] = p.scores + static_cast<size_t>(b * NN + j) * p.len_stride;
  }

  float acc[NN * 32];
#pragma unroll
  for (int i = 0; i < NN * 32; ++i) acc[i] = 0.f;

  for (int i = 0; i < npg; ++i) {
    // Wait for group i (page i). Groups committed: kAhead + i in the base, EARLY kAhead at i = 0 and
    // kAhead + i - 1 after; so i + 1 complete leaves kStages - 2 pending, except at EARLY's i = 0.
    if (kEarly && i == 0) cp_async_wait<kStages - 1>();
    else cp_async_wait<kStages - 2>();
    // cp.async fills smem through the generic proxy; wgmma reads it through the async proxy.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();   // page i visible to all; everyone is done with the slot refilled below
    if (i == 0) tl_stamp(kTlScore, 2);
    if (i == npg - 1) tl_stamp(kTlScore, 3);
    if (!kEarly || i > 0) {
      const int nx = i + kStages - 1;   // into slot (i - 1) % kStages, consumed in iteration i - 1
      if (nx < npg) load_page(nx, nx % kStages);
      cp_async_commit();
    }
    const int slot = i % kStages;
    const uint32_t tile = smem_u32(k_s + slot * kTileBytes);
#if defined(DSA_HAS_WGMMA)
    if constexpr (kWgmma) page_dots_wgmma<NN>(acc, tile, smem_u32(q_s));
    else page_dots_mma<NN>(acc, tile, smem_u32(q_s), warp, lane);
#else
    page_dots_mma<NN>(acc, tile, smem_u32(q_s), warp, lane);
#endif
    const int kl = warp * 16 + g + t4 * 8;   // local key this lane stores (lanes t4 = 0, 1)
    const int s = (pg0 + i) * kPage + kl;
    const float scale = sc_s[slot * kPage + (kl & 63)];
#pragma unroll
    for (int j = 0; j < NN; ++j) {
      float p0 = 0.f, p1 = 0.f;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        const float* a = &acc[4 * (8 * j + n)];
        p0 = fmaf(wr[j][n][0], fmaxf(a[0], 0.f), p0);
        p0 = fmaf(wr[j][n][1], fmaxf(a[1], 0.f), p0);
        p1 = fmaf(wr[j][n][0], fmaxf(a[2], 0.f), p1);
        p1 = fmaf(wr[j][n][1], fmaxf(a[3], 0.f), p1);
      }
      p0 += __shfl_xor_sync(0xffffffffu, p0, 1);
      p1 += __shfl_xor_sync(0xffffffffu, p1, 1);
      p0 += __shfl_xor_sync(0xffffffffu, p0, 2);
      p1 += __shfl_xor_sync(0xffffffffu, p1, 2);
      if (t4 < 2 && s < len[j]) {
        const float v = (t4 == 0 ? p0 : p1) * scale;
        srow[j][s] = v;
        if constexpr (kFused) loc_s[j * p.chunk_pages * kPage + i * kPage + kl] = v;
        if (want_hist[j]) {
          const uint32_t bin = ord_key(v) >> 20;
          atomicAdd(&hist_s[j * (kBins1 / 2) + (bin >> 1)], (bin & 1) ? 0x10000u : 1u);
        }
      }
    }
  }
  tl_stamp(kTlScore, 4);   // the last page's scores stored
  cp_async_wait<0>();
  __syncthreads();
  tl_stamp(kTlScore, 6);   // every warp's too
#pragma unroll
  for (int j = 0; j < NN; ++j) {
    if (!want_hist[j]) continue;
    // Both bins of a word in one 64-bit atomic (bin 2i in the low half, 2i + 1 in the high half of the row's
    // int pair; neither count carries into the other). Scores crowd into a few dozen bins (the key's top 12 bits
    // are the sign, the exponent and 3 mantissa bits), so every CTA adds into the same few words at about the same
    // time, and the grid completes (releasing the select) only when the L2 has served them all: half as many
    // atomics there (NOTES.md "Where an indexer call's time goes at one row").
    using u64 = unsigned long long;
    u64* gh = reinterpret_cast<u64*>(p.ghist + static_cast<size_t>(b * NN + j) * kBins1);
    for (int i = tid; i < kBins1 / 2; i += kScoreThreads) {
      const uint32_t c = hist_s[j * (kBins1 / 2) + i];
      if (c) atomicAdd(&gh[i], static_cast<u64>(c & 0xFFFFu) | static_cast<u64>(c >> 16) << 32);
    }
  }
  tl_stamp(kTlScore, 5);   // the histogram's atomics issued
  if constexpr (kFused) {
    fused_select<NN>(p, b, len, pg0, npg, n_parts, loc_s, reinterpret_cast<int*>(hist_s),
                     reinterpret_cast<uint2*>(k_s));
  }
}

// ---------------------------------------------------------------------------------------------
}  // namespace
