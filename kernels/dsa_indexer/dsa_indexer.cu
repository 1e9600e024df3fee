// DSA lightning indexer with fused exact top-k (DeepSeek V3.2 / V4 sparse attention).
//
// For each decode query token t (row = b * next_n + j) and each key position s < len(t):
//   I[t, s] = k_scale[s] * sum_h w[t, h] * ReLU(q[t, h] . k[s])        (64 heads x 128 dims, fp8 e4m3)
// then the exact top-k positions of I[t, 0:len(t)] as int32 (rows with len <= k: 0..len-1, then -1).
//
// Inputs (all contiguous, device memory):
//   q            fp8 e4m3 [B, next_n, 64, 128]   (q's own scale is folded into the weights, as DeepGEMM)
//   weights      fp32 [B * next_n, 64]
//   kv           uint8 [num_blocks, 64 * 132]    per 64-token block: 64 x 128 fp8 keys, then 64 fp32 scales
//   ctx          int32 [B] (ctx_mode 0) or [B, next_n] (ctx_mode 1)
//                mode 0 follows DeepGEMM's causal rule: token j of request b sees
//                len = ctx[b] - next_n + 1 + j keys (the last query token sees all ctx[b] keys).
//   block_table  int32 [B, max_blocks]; only entries below ceil(max_j len / 64) are dereferenced (the base
//                kernels read no others; the early ones also read, unused, entries up to the plan's bound).
// Outputs: out int32 [B * next_n, topk] (unordered set for rows longer than topk);
//          scores fp32 [B * next_n, len_stride]: the logits, written at s < len only.
//
// Two launches, cost proportional to the actual lengths (CTAs past a row's length exit at once):
//   dsa_score_*: grid (chunks, B). One CTA scores chunk_pages pages of one request for all next_n
//     tokens (keys read once, 6-stage cp.async ring), writes the fp32 scores, and adds a 4096-bin
//     histogram of each score's top 12 order-preserving bits into the row's global histogram.
//   dsa_select: grid (CTAs per row, rows), one wave, launched with programmatic dependent launch.
//     Each CTA finds the threshold bin T1 (count above T1 < k <= count at or above) from the row's
//     histogram while its scores stream in (select_subs x 4096 through a cp.async ring), classifies
//     them, places its outputs with one block scan and one global atomic per counter, writes the
//     positions above T1 straight into the output and those in bin T1 (key, position) to a candidate
//     list. The last CTA of the row resolves the remaining slots exactly on the last 20 bits (two
//     10-bit radix rounds, in shared memory when the candidates fit) and resets the row's histogram
//     and counters, so the workspace stays zero between calls without a memset launch.
// Scores equal to the k-th score bit-for-bit are taken in arbitrary order.
// Small-batch variants of both launches (dsa_score_early_*, dsa_select_early, dsa_select_cluster; chosen per plan
// by the launcher) compute the same thing with fewer dependent global round trips: see score_body and select_body.
//
// sm_90a: wgmma (QGMMA) with keys as the 64-row A operand and q as B, both in 128B-swizzled smem.
// other targets (sm_120a): mma.sync m16n8k32 e4m3 with ldmatrix from the same smem layout.
#include <cstdint>

// smem_u32, griddep_*, cp_async_commit / _wait.
#include "../common/ptx.cuh"
// Constants, DsaParams, the scoring shared-memory layout and the kernel table.
#include "dsa_indexer.h"

namespace {

// Order-preserving uint32 of a float: flip all bits of negatives, only the sign bit of positives.
__device__ __forceinline__ uint32_t ord_key(float x) {
  const uint32_t u = __float_as_uint(x);
  return u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
}

__device__ __forceinline__ int row_len(const DsaParams& p, int b, int j) {
  const int cap = min(p.len_stride, p.max_blocks * kPage);
  const int l = p.ctx_mode ? p.ctx[b * p.next_n + j] : p.ctx[b] - p.next_n + 1 + j;
  return max(0, min(l, cap));
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

// Row r of a 128-byte-row tile, 16-byte chunk c, with the 128B swizzle wgmma expects
// (address bits [4:6] ^= bits [7:9]); also keeps ldmatrix free of bank conflicts.
__device__ __forceinline__ uint32_t swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// Timeline (tuning build only, PDSERVE_TUNING_PROBES; kernels/tuning/probe_indexer_timeline.py): thread 0 of each
// CTA writes the global timer (ns, comparable across SMs) at its phases into dsa_timeline, read back through
// cuModuleGetGlobal; `after` is a value the phase produced, so the reading waits for it. In the production build
// the calls compile to nothing (the fatbin's bytes are the same with and without them).
#if defined(PDSERVE_TUNING_PROBES)
constexpr int kTlScoreCtas = 4096, kTlScoreSlots = 8, kTlSelectCtas = 256, kTlSelectSlots = 16;
}  // namespace: the array keeps its plain name, for cuModuleGetGlobal
extern "C" {
__device__ unsigned long long dsa_timeline[kTlScoreCtas * kTlScoreSlots + kTlSelectCtas * kTlSelectSlots];
}
namespace {
#endif
enum TlKernel { kTlScore, kTlSelect };
#if defined(PDSERVE_TUNING_PROBES)
// This CTA's word `slot` of dsa_timeline (scoring CTAs first, then select CTAs), or null past the array.
__device__ __forceinline__ unsigned long long* tl_word(TlKernel kernel, int slot) {
  const int cta = blockIdx.x + gridDim.x * blockIdx.y;
  if (kernel == kTlScore) return cta < kTlScoreCtas ? &dsa_timeline[cta * kTlScoreSlots + slot] : nullptr;
  return cta < kTlSelectCtas ? &dsa_timeline[kTlScoreCtas * kTlScoreSlots + cta * kTlSelectSlots + slot] : nullptr;
}
#endif
__device__ __forceinline__ void tl_stamp(TlKernel kernel, int slot, uint32_t after = 0) {
#if defined(PDSERVE_TUNING_PROBES)
  if (threadIdx.x != 0) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t) : "r"(after) : "memory");
  if (unsigned long long* w = tl_word(kernel, slot)) *w = t;
#else
  (void)kernel, (void)slot, (void)after;
#endif
}
// A count beside the stamps (thread 0's value), e.g. how many candidates tied.
__device__ __forceinline__ void tl_value(TlKernel kernel, int slot, int value) {
#if defined(PDSERVE_TUNING_PROBES)
  if (threadIdx.x != 0) return;
  if (unsigned long long* w = tl_word(kernel, slot)) *w = static_cast<unsigned long long>(value);
#else
  (void)kernel, (void)slot, (void)value;
#endif
}

// ---------------------------------------------------------------------------------------------
// Tensor-core paths. Both leave, for warp w and lane (g = lane / 4, t = lane % 4), in acc[4n + i]:
//   i=0,1: D[key 16w + g][head col 8n + 2t + i];  i=2,3: D[key 16w + g + 8][...]
// where head col 64j + h is head h of query token j.

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSA_HAS_WGMMA 1
__device__ __forceinline__ void wgmma_m64n64k32(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_m64n128k32(float (&d)[64], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>(1) << 16;             // leading byte offset: unused for swizzled K-major
  d |= static_cast<uint64_t>(1024 >> 4) << 32;     // stride byte offset: 8 rows x 128 B
  d |= static_cast<uint64_t>(1) << 62;             // 128B swizzle
  return d;
}

template <int NN>
__device__ __forceinline__ void page_dots_wgmma(float (&acc)[NN * 32], uint32_t tile, uint32_t qtile) {
#pragma unroll
  for (int i = 0; i < NN * 32; ++i) asm volatile("" : "+f"(acc[i])::"memory");
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  const uint64_t da = sw128_desc(tile), db = sw128_desc(qtile);
#pragma unroll
  for (int k = 0; k < kDim / 32; ++k) {
    if constexpr (NN == 1) wgmma_m64n64k32(acc, da + 2 * k, db + 2 * k, k);
    else wgmma_m64n128k32(acc, da + 2 * k, db + 2 * k, k);
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
  for (int i = 0; i < NN * 32; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}
#endif

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void mma_e4m3(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

template <int NN>
__device__ __forceinline__ void page_dots_mma(float (&acc)[NN * 32], uint32_t tile, uint32_t qtile, int warp,
                                              int lane) {
#pragma unroll
  for (int i = 0; i < NN * 32; ++i) acc[i] = 0.f;
  const int mat = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < kDim / 32; ++kk) {
    uint32_t a[4];
    {
      const int r = warp * 16 + (lane & 7) + ((mat & 1) << 3);
      ldsm_x4(tile + swz(r, 2 * kk + (mat >> 1)), a[0], a[1], a[2], a[3]);
    }
#pragma unroll
    for (int nb = 0; nb < NN * 8; nb += 2) {
      const int h = 8 * (nb + (mat >> 1)) + (lane & 7);
      uint32_t b0, b1, b2, b3;
      ldsm_x4(qtile + swz(h, 2 * kk + (mat & 1)), b0, b1, b2, b3);
      mma_e4m3(&acc[4 * nb], a, b0, b1);
      mma_e4m3(&acc[4 * (nb + 1)], a, b2, b3);
    }
  }
}

// ---------------------------------------------------------------------------------------------
template <int NT, typename T = int>
__device__ __forceinline__ T block_excl_scan(T v, T* s_warp, T* total = nullptr) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) s_warp[warp] = x;
  __syncthreads();
  T base = 0, all = 0;
#pragma unroll
  for (int w = 0; w < NT / 32; ++w) {
    if (w < warp) base += s_warp[w];
    all += s_warp[w];
  }
  if (total) *total = all;
  __syncthreads();
  return base + x - v;
}

// Bins are scanned from the top; thread t holds counts of bins top - PER*t - i in c[i].
// Finds T with count(bin > T) < need <= count(bin >= T); s_res = {T, count(bin > T)}.
template <int PER, int NT>
__device__ __forceinline__ void find_threshold(const int (&c)[PER], int nbins, int need, int* s_warp, int* s_res) {
  int local = 0;
#pragma unroll
  for (int i = 0; i < PER; ++i) local += c[i];
  const int excl = block_excl_scan<NT>(local, s_warp);
  if (excl < need && excl + local >= need) {
    int acc = excl;
    bool found = false;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      if (!found && acc + c[i] >= need) {
        s_res[0] = nbins - 1 - PER * static_cast<int>(threadIdx.x) - i;
        s_res[1] = acc;
        found = true;
      }
      acc += c[i];
    }
  }
  __syncthreads();
}

// find_threshold over a row's global 4096-bin histogram `gh1`, read by NT threads: thread t holds the
// kBins1 / NT bins from 4095 - PER t down (loaded as int4, L2 only: other CTAs wrote them).
template <int NT>
__device__ __forceinline__ void row_threshold(const int* gh1, int tid, int need, int* s_warp, int* s_res) {
  constexpr int PER = kBins1 / NT;
  int c[PER];
  const int4* src = reinterpret_cast<const int4*>(gh1 + kBins1 - PER * (tid + 1));
#pragma unroll
  for (int u = 0; u < PER / 4; ++u) {
    const int4 x = __ldcg(src + u);
    c[PER - 1 - 4 * u] = x.x;
    c[PER - 2 - 4 * u] = x.y;
    c[PER - 3 - 4 * u] = x.z;
    c[PER - 4 - 4 * u] = x.w;
  }
  find_threshold<PER, NT>(c, kBins1, need, s_warp, s_res);
}

// Output space for this CTA: n_sure sure positions and n_tie tied ones per thread, reserved with one block scan
// and one atomic per counter of the row (ctr[0]: sure, ctr[1]: tied); ps / pt: this thread's first slots.
template <int NT>
__device__ __forceinline__ void reserve_slots(int n_sure, int n_tie, int tid, int* ctr, unsigned long long* s_warp64,
                                              int* s_misc, int& ps, int& pt) {
  unsigned long long total = 0;
  const unsigned long long excl = block_excl_scan<NT, unsigned long long>(
      static_cast<unsigned long long>(n_sure) | (static_cast<unsigned long long>(n_tie) << 32), s_warp64, &total);
  if (tid == 0) {
    const int ts = static_cast<int>(total & 0xFFFFFFFFull), tt = static_cast<int>(total >> 32);
    s_misc[0] = ts ? atomicAdd(&ctr[0], ts) : 0;
    s_misc[1] = tt ? atomicAdd(&ctr[1], tt) : 0;
  }
  __syncthreads();
  ps = s_misc[0] + static_cast<int>(excl & 0xFFFFFFFFull);
  pt = s_misc[1] + static_cast<int>(excl >> 32);
}

// find_threshold over an NBINS-bin shared-memory histogram read by NT threads (thread t: PER bins from the top).
template <int NT, int NBINS>
__device__ __forceinline__ void smem_threshold(const int* s_hist, int tid, int need, int* s_warp, int* s_res) {
  constexpr int PER = NBINS / NT;
  int c[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) c[i] = s_hist[NBINS - 1 - PER * tid - i];
  find_threshold<PER, NT>(c, NBINS, need, s_warp, s_res);
}

// Resolve the threshold bin T1 of one row exactly on the remaining 20 bits (two 10-bit radix rounds):
// n_tie candidates (order key, position) in `cand` (global), need1 = slots left after the above1 sure
// ones. From shared memory (s_cand, kResolveCap entries) when they fit, else straight from global.
// s_hist holds kBins2 ints. Called by all NT threads of one CTA; ends without a trailing barrier.
// preloaded: the caller has the n_tie candidates in s_cand already (dsa_select_cluster's rank 0; a run-time flag,
// so that kernel inlines one copy of the resolve for both of its cases).
template <int NT>
__device__ __forceinline__ void resolve_ties(int* out, const uint2* cand, int n_tie, int need1, int above1,
                                             uint2* s_cand, int* s_hist, int* s_warp, int* s_res, int* s_misc,
                                             bool preloaded = false) {
  const int tid = threadIdx.x;
  const bool in_smem = preloaded || n_tie <= kResolveCap;
  if (in_smem && !preloaded) {
    for (int i = tid; i < n_tie; i += NT) s_cand[i] = __ldcg(&cand[i]);
  }
  auto each = [&](auto&& fn) {
    if (in_smem) {
      for (int i = tid; i < n_tie; i += NT) fn(s_cand[i]);
    } else {
      constexpr int kUnroll = 8;   // candidate loads in flight per thread
      for (int base = 0; base < n_tie; base += NT * kUnroll) {
        uint2 e[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int i = base + u * NT + tid;
          e[u] = i < n_tie ? __ldcg(&cand[i]) : make_uint2(0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (base + u * NT + tid < n_tie) fn(e[u]);
      }
    }
  };
  for (int i = tid; i < kBins2; i += NT) s_hist[i] = 0;
  if (tid == 0) {
    s_misc[0] = 0;   // output slots used after above1
    s_misc[1] = 0;   // exact-tie slots taken
  }
  __syncthreads();
  each([&](uint2 e) { atomicAdd(&s_hist[(e.x >> 10) & (kBins2 - 1)], 1); });
  __syncthreads();
  smem_threshold<NT, kBins2>(s_hist, tid, need1, s_warp, s_res);
  const uint32_t T2 = static_cast<uint32_t>(s_res[0]);
  tl_stamp(kTlSelect, 9, T2);   // (the fused kernels' resolve stamps these slots too; the probe times the split path)
  const int need2 = need1 - s_res[1];
  for (int i = tid; i < kBins3; i += NT) s_hist[i] = 0;
  __syncthreads();
  each([&](uint2 e) {
    const uint32_t b2 = (e.x >> 10) & (kBins2 - 1);
    if (b2 > T2) out[above1 + atomicAdd(&s_misc[0], 1)] = static_cast<int>(e.y);
    else if (b2 == T2) atomicAdd(&s_hist[e.x & (kBins3 - 1)], 1);
  });
  __syncthreads();
  smem_threshold<NT, kBins3>(s_hist, tid, need2, s_warp, s_res);
  const uint32_t T3 = static_cast<uint32_t>(s_res[0]);
  tl_stamp(kTlSelect, 10, T3);
  const int need3 = need2 - s_res[1];
  each([&](uint2 e) {
    if (((e.x >> 10) & (kBins2 - 1)) != T2) return;
    const uint32_t low = e.x & (kBins3 - 1);
    if (low > T3 || (low == T3 && atomicAdd(&s_misc[1], 1) < need3))
      out[above1 + atomicAdd(&s_misc[0], 1)] = static_cast<int>(e.y);
  });
}

__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}


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

#define DSA_SCORE_KERNEL(NAME, NN, WGMMA, FUSED, EARLY)                                                  \
  extern "C" __global__ void __launch_bounds__(kScoreThreads) NAME(const __grid_constant__ DsaParams p) { \
    score_body<NN, WGMMA, FUSED, EARLY>(p);                                                             \
  }
DSA_SCORE_KERNELS(DSA_SCORE_KERNEL)

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

#define DSA_SELECT_KERNEL(NAME, EARLY, CLUSTER)                                                            \
  extern "C" __global__ void __launch_bounds__(kSelectThreads) NAME(const __grid_constant__ DsaParams p) { \
    select_body<EARLY, CLUSTER>(p);                                                                       \
  }
DSA_SELECT_KERNELS(DSA_SELECT_KERNEL)
