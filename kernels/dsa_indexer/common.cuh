#pragma once
// DSA lightning indexer (DeepSeek V3.2 / V4), sm_90a / sm_120a: what both kernel families share. The design
// note (the equations, inputs, the two launches and their small-batch variants) heads dsa_indexer.cu, the one
// translation unit that includes the families (score.cuh, select.cuh) and instantiates the kernels. Here: the
// order key, row lengths, cp.async and the 128B swizzle, the timeline stamps of the tuning build, the two
// tensor-core paths of the scoring, and the top-k pieces both the fused scoring and the selection use (block
// scan, threshold search over a histogram, output reservation, the exact resolve of the tied bin).
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
}  // namespace
