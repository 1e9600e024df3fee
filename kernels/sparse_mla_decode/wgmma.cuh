// wgmma primitives (sm_90a only: MLA_HAS_WGMMA) and the pieces the wg, wge and wgt kernel bodies share.
#pragma once
#include "common.cuh"

namespace {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLA_HAS_WGMMA 1
// Named barrier ids (0 is __syncthreads).
constexpr int kBarFull = 1, kBarFree = 3, kBarPFull = 5, kBarPFree = 7, kBarProd = 9, kBarFin = 10, kBarQGo = 11,
              kBarQ = 12;

__device__ __forceinline__ void bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

// wgmma shared-memory descriptor, 128-byte swizzle; lbo / sbo in bytes.
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}
// Byte offset of 16-byte chunk c (8 dims) of row r in a [d/64][R rows][128 B] swizzled tile.
template <int R>
__device__ __forceinline__ int wg_swz(int r, int c) {
  return (c >> 3) * (R * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}
// The wgt kernels' tile layout: [64 / 8 entry groups][d/64 column blocks][8 entries][128 B], the same 1024-byte
// swizzle atoms as wg_swz ordered group-major, so that the 8 entries a producer warp converts lie in one contiguous
// run of kWgtGroup bytes (the cluster pair hands them to the peer in one bulk copy, not one per column block). The
// wgmma descriptors step 1024 B between column blocks and kWgtGroup between entry groups.
template <int DQK>
constexpr int kWgtGroup = DQK / 64 * 1024;
template <int DQK>
__device__ __forceinline__ int wgt_off(int r, int c) {
  return (r >> 3) * kWgtGroup<DQK> + (c >> 3) * 1024 + (r & 7) * 128 + (((c & 7) ^ (r & 7)) << 4);
}

// QK: S (64 x 32, fp32) += A B^T, A and B of 16-bit type TY in shared memory, both K-major.
#define MLA_WGMMA_QK(NAME, TY) \
__device__ __forceinline__ void NAME(float (&d)[16], uint64_t da, uint64_t db, int scale_d) { \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " " \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
      : "l"(da), "l"(db), "r"(scale_d)); \
}
MLA_WGMMA_QK(wgmma_m64n32k16_ss, "bf16")
MLA_WGMMA_QK(wgmma_m64n32k16_ss_h, "f16")
// PV: A (P, type TY) from registers, B (V) MN-major ("transposed") from shared memory; accumulates into d.
#define MLA_WGMMA_PV(NAME, TY) \
__device__ __forceinline__ void NAME(float (&d)[128], const uint32_t (&a)[4], uint64_t db) { \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " " \
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, " \
      "{%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n" \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127]) \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)); \
}
MLA_WGMMA_PV(wgmma_m64n256k16_rs, "bf16")
MLA_WGMMA_PV(wgmma_m64n256k16_rs_h, "f16")
template <bool H>
__device__ __forceinline__ void wgmma_qk(float (&d)[16], uint64_t da, uint64_t db, int scale_d) {
  if constexpr (H) wgmma_m64n32k16_ss_h(d, da, db, scale_d);
  else wgmma_m64n32k16_ss(d, da, db, scale_d);
}
template <bool H>
__device__ __forceinline__ void wgmma_pv(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {
  if constexpr (H) wgmma_m64n256k16_rs_h(d, a, db);
  else wgmma_m64n256k16_rs(d, a, db);
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit_wait() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// 16 e4m3 values (one 16-byte chunk, already loaded) times the chunk's scale -> 16 bf16, with sb = scale x 2^112
// as exact, normal bf16 bits (scale_bf16_112): one bf16x2 multiply per pair. Other scales take fp8x16_to_bf16.
__device__ __forceinline__ void fp8x16_to_bf16_fast(const uint4 w, uint32_t sb, uint4& lo, uint4& hi) {
  const uint32_t s2 = sb | (sb << 16);
  fp8x16_by_pairs(w, [s2](uint32_t two) { return fp8x2_to_bf16x2_fast(two, s2); }, lo, hi);
}

// One entry's share of a wg kernel's bf16 tile (T rows): the fp8 chunks c16 = j + STRIDE k (k < K, c16 < NCH) of the raw
// record `rec` in shared memory, already loaded as w[k], into row e of `tile`; zeros for an invalid entry. When every
// scale of the record takes the fast path (fast_scales: in practice always for V4's UE8M0 scales and for powers of
// two) the unrolled fast conversion runs, else a loop that is not unrolled converts every chunk through fp32,
// reading it again from the record. So the hot code holds no fp32 path: a call fetches its code cold for the
// first tile, and the smaller producer loop measured 0.91-0.93x at h=128 (NOTES.md "Cold code").
template <class L, int T, int K, int STRIDE, int NCH>
__device__ __forceinline__ void wg_convert_entry(const uint4 (&w)[K], const uint8_t* rec, const uint8_t* srec,
                                                 bool valid, int j, int e, uint8_t* tile) {
  if (!valid || L::fast_scales(srec)) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c16 = j + STRIDE * k;
      if (c16 >= NCH) continue;
      uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;   // invalid entry: zeros (its raw scale is garbage)
      if (valid) fp8x16_to_bf16_fast(w[k], L::scale_bf16_112(srec, c16), lo, hi);
      *reinterpret_cast<uint4*>(tile + wg_swz<T>(e, 2 * c16)) = lo;
      *reinterpret_cast<uint4*>(tile + wg_swz<T>(e, 2 * c16 + 1)) = hi;
    }
  } else {
#pragma unroll 1
    for (int c16 = j; c16 < NCH; c16 += STRIDE) {
      uint4 lo, hi;
      fp8x16_to_bf16(*reinterpret_cast<const uint4*>(rec + c16 * 16), L::scale(srec, c16), lo, hi);
      *reinterpret_cast<uint4*>(tile + wg_swz<T>(e, 2 * c16)) = lo;
      *reinterpret_cast<uint4*>(tile + wg_swz<T>(e, 2 * c16 + 1)) = hi;
    }
  }
}

// f16 tile (H): 16 e4m3 values times the chunk's scale -> 16 f16 (cvt.rn.f16x2.e4m3x2, exact, then one f16x2
// multiply by the scale when it is a power of two that is a normal f16, 2^-14 .. 2^15: exact while the product
// is a normal f16). Other scales: through fp32, rounded to f16.
template <class L>
__device__ __forceinline__ void wg_convert16_f16(const uint4 w, const uint8_t* srec, int c16, uint4& lo, uint4& hi) {
  const uint32_t b = __float_as_uint(L::scale(srec, c16));
  const int e = static_cast<int>((b >> 23) & 0xffu) - 127;
  const uint32_t x[4] = {w.x, w.y, w.z, w.w};
  uint32_t h[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) cvt_e4m3x4(x[i], h[2 * i], h[2 * i + 1]);
  if ((b & 0x7fffffu) == 0 && e >= -14 && e <= 15) {
    const uint32_t s1 = static_cast<uint32_t>(e + 15) << 10, s2 = s1 | (s1 << 16);
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = hmul2(h[i], s2);
  } else {
    const float sc = __uint_as_float(b);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h[i]));
      h[i] = pack_f16(f.x * sc, f.y * sc);
    }
  }
  lo = make_uint4(h[0], h[1], h[2], h[3]);
  hi = make_uint4(h[4], h[5], h[6], h[7]);
}
// Eight bf16 (RoPE dims) -> eight f16 (exact for magnitudes 2^-14 .. 65504).
__device__ __forceinline__ uint4 bf16x8_to_f16(uint4 v) {
  const uint32_t x[4] = {v.x, v.y, v.z, v.w};
  uint32_t y[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) y[i] = pack_f16(__uint_as_float(x[i] << 16), __uint_as_float(x[i] & 0xffff0000u));
  return make_uint4(y[0], y[1], y[2], y[3]);
}

// ---- pieces of the wg and wge bodies (the same CTA: 384 threads, 64 heads, 32-entry tiles, bulk-copy ring,
// named barriers, split protocol), inlined into both: every kernel's SASS is the same as with the pieces written
// out in each body (cuobjdump -sass of both targets, function by function, 2026-12-01). As helpers, the per-head Q
// exponents, the online softmax and the epilogue's (m, l) hand-over changed the SASS (ptxas renumbered the
// consumers' registers): they are macros (WG_Q_EXPONENTS, WG_SOFTMAX_TILE, WG_ML_HANDOVER), which leave the fatbin's
// bytes as they were. Still written out in each: the gather issue (wge's reads V3.2 records only).

// The epilogue's (m, l) hand-over: warpgroup 0 (WG == 0) completes its rows' sums L_RUN over the quad and hands
// (M_RUN, L_RUN) through FIN[CTID] (float4) to the same thread of warpgroup 1, which takes them as its own. (A macro:
// see above.)
#define WG_ML_HANDOVER(WG, M_RUN, L_RUN, FIN, CTID)                       \
  if (WG == 0) {                                                          \
    _Pragma("unroll") for (int r = 0; r < 2; ++r) {                       \
      L_RUN[r] += __shfl_xor_sync(0xffffffffu, L_RUN[r], 1);              \
      L_RUN[r] += __shfl_xor_sync(0xffffffffu, L_RUN[r], 2);              \
    }                                                                     \
    FIN[CTID] = make_float4(M_RUN[0], M_RUN[1], L_RUN[0], L_RUN[1]);      \
    bar_arrive(kBarFin, 256);                                             \
  } else {                                                                \
    bar_sync(kBarFin, 256);                                               \
    const float4 f4 = FIN[CTID];                                          \
    M_RUN[0] = f4.x; M_RUN[1] = f4.y; L_RUN[0] = f4.z; L_RUN[1] = f4.w;   \
  }

// Per-head power-of-two exponent k that puts max |q| into [2^14, 2^15), into QEXP[r] for the 64 heads H0 + r (warp w:
// heads w, w + 12, ...; the caller's warp and lane); the caller synchronizes before reading them. (A macro: see
// above.)
#define WG_Q_EXPONENTS(P, ROW, H0, DQK_, QEXP)                                                             \
  for (int r = warp; r < 64; r += kWgThreads / 32) {                                                        \
    const int head = H0 + r;                                                                                \
    uint32_t m = 0;                                                                                         \
    if (head < P.h) {                                                                                       \
      const uint4* qh = reinterpret_cast<const uint4*>(P.q + (static_cast<size_t>(ROW) * P.h + head) * DQK_); \
      for (int c = lane; c < DQK_ / 8; c += 32) {                                                           \
        const uint4 v = __ldg(qh + c);                                                                      \
        const uint32_t x[4] = {v.x, v.y, v.z, v.w};                                                         \
        _Pragma("unroll") for (int i = 0; i < 4; ++i) m = max(m, max(x[i] & 0x7fffu, (x[i] >> 16) & 0x7fffu)); \
      }                                                                                                     \
    }                                                                                                       \
    _Pragma("unroll") for (int o = 16; o; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));          \
    if (lane == 0) QEXP[r] = q_shift(m << 16);                                                              \
  }

// The ring's mbarriers (thread 0): full[NST], one arrival (with its bytes) per producer warp, and (SC)
// raw_free[NST], one per warp of warpgroup 1. Then the Q block's generic stores are made visible to wgmma and
// the CTA synchronizes.
template <int NST, bool SC>
__device__ __forceinline__ void wg_ring_init(int tid, uint64_t* full, uint64_t* raw_free) {
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < NST; ++s) mbar_init(full + s, 4);
    if constexpr (SC)
      for (int s = 0; s < NST; ++s) mbar_init(raw_free + s, 4);
    mbar_fence_init();
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // Q: generic stores -> wgmma reads
  __syncthreads();
}

// SC: warpgroup 1 converts its half of tile x (convert_half(x)) once the raw entries have landed, hands it over,
// and lets the producer refill ring slot x % NST unless no tile x + NST comes.
template <int NST, class Convert>
__device__ __forceinline__ void wg1_convert_tile(int x, int ntiles, int lane, uint64_t* full, uint64_t* raw_free,
                                                 const Convert& convert_half) {
  mbar_wait(full + x % NST, (x / NST) & 1);
  convert_half(x);
  bar_arrive(kBarFull + (x & 1), kWgThreads);
  if (x + NST < ntiles) {
    __syncwarp();
    if (lane == 0) mbar_arrive(raw_free + x % NST);
  }
}

// P (bf16, or F16 f16) as the A operand of PV k-step kk (entries 16 kk .. 16 kk + 15).
template <bool F16>
__device__ __forceinline__ void wg_pack_p(uint32_t (&a)[2][4], const float (&s)[16]) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    auto pk = [](float x, float y) { return F16 ? pack_f16(x, y) : pack_bf16(x, y); };
    a[kk][0] = pk(s[8 * kk + 0], s[8 * kk + 1]);
    a[kk][1] = pk(s[8 * kk + 2], s[8 * kk + 3]);
    a[kk][2] = pk(s[8 * kk + 4], s[8 * kk + 5]);
    a[kk][3] = pk(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// End of a consumer's tile it: tile buffer it & 1 is released to the producer unless no tile it + 2 comes; SC:
// warpgroup 1 waits until warpgroup 0 is done with it too and refills it itself (refill(it + 2)).
template <bool SC, class Refill>
__device__ __forceinline__ void wg_release_tile(int it, int ntiles, int wg, const Refill& refill) {
  if (it + 2 < ntiles) {
    if (SC && wg == 1) {
      bar_sync(kBarFree + (it & 1), kWgThreads);
      refill(it + 2);
    } else {
      bar_arrive(kBarFree + (it & 1), kWgThreads);
    }
  }
}

// The online softmax's maximum step for a consumer thread's two head rows (wg, wge and wgt kernels): mx holds
// this thread's maximum of the tile's scores per row; the quad (the row's four threads) shares it, and the
// running maximum m_run, the offset m_use the scores are exponentiated against and the old sum's rescale alpha
// follow.
__device__ __forceinline__ void wg_row_max_update(float (&mx)[2], float (&m_run)[2], float (&m_use)[2],
                                                  float (&alpha)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(m_run[r], mx[r]);
    m_use[r] = m_new == -INFINITY ? 0.f : m_new;   // nothing valid yet: exp2(-inf - 0) = 0, never NaN
    alpha[r] = exp2f(m_run[r] - m_use[r]);
    m_run[r] = m_new;
  }
}

// The online softmax's steps after the maximum (wg_row_max_update), in place on a consumer thread's N scores S of
// one tile (head row r0 for S[i] with (i >> 1) & 1 = 0, else r0 + 8): S becomes P = exp2(S - M_USE) and L_RUN the
// running sums rescaled by ALPHA plus this thread's part of the tile's (the quad's partial sums are combined once at
// the end: ALPHA is the same across the quad). Declares sum.
// This and WG_SOFTMAX_TILE are macros rather than functions: as inlined functions (their arrays then the kernel's
// first locals) the same code compiles to other bytes, and the production fatbin's are fixed (kernels/build.sh).
#define WG_EXP_SUM(S, N, M_USE, ALPHA, L_RUN)                     \
  float sum[2] = {0.f, 0.f};                                     \
  _Pragma("unroll") for (int i = 0; i < N; ++i) {                \
    S[i] = exp2f(S[i] - M_USE[(i >> 1) & 1]);                    \
    sum[(i >> 1) & 1] += S[i];                                   \
  }                                                              \
  L_RUN[0] = L_RUN[0] * ALPHA[0] + sum[0];                       \
  L_RUN[1] = L_RUN[1] * ALPHA[1] + sum[1]

// One tile's online softmax for a consumer thread of the wg and wge kernels, in place on its scores S (float[16];
// S[4 j + q]: head row r0 (q < 2) or r0 + 8, entry 8 j + 2 t + (q & 1) of the tile, whose validated indices start
// at SIDX[I0]): the scores of invalid entries become -inf, the others are scaled by their row's SROW; then the
// maximum step (ALPHA: the old O's and sum's rescale) and WG_EXP_SUM. Declares mx, m_use and sum.
#define WG_SOFTMAX_TILE(S, T_, SIDX, I0, SROW, M_RUN, ALPHA, L_RUN)   \
  float mx[2] = {-INFINITY, -INFINITY};                              \
  _Pragma("unroll") for (int j = 0; j < 4; ++j)                      \
  _Pragma("unroll") for (int q = 0; q < 4; ++q) {                    \
    const bool ok = SIDX[I0 + 8 * j + 2 * T_ + (q & 1)] >= 0;        \
    S[4 * j + q] = ok ? S[4 * j + q] * SROW[q >> 1] : -INFINITY;     \
    mx[q >> 1] = fmaxf(mx[q >> 1], S[4 * j + q]);                    \
  }                                                                  \
  float m_use[2];                                                    \
  wg_row_max_update(mx, M_RUN, m_use, ALPHA);                        \
  WG_EXP_SUM(S, 16, m_use, ALPHA, L_RUN)

// A consumer warpgroup's PV step (wg and wgt kernels): O (its 256 dims) rescaled by alpha per head row, then
// O += P V over KS k-steps of 16 entries, P from registers (a[kk]), V = the T-entry tile at tile_u read MN-major
// (dims 256 wg ..: four 64-dim column blocks; leading byte offset between column blocks, stride between 8-entry
// groups, as measured in NOTES.md "wg kernels"), then waited for. KS = 0: the probes that skip the wgmma.
template <bool H, int T, int KS, int NA, int G = 0>
__device__ __forceinline__ void wg_pv_step(float (&o)[128], const uint32_t (&a)[NA][4], const float (&alpha)[2],
                                           uint32_t tile_u, int wg) {
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
    wgmma_pv<H>(o, a[kk], G ? wg_desc(tile_u + wg * 4 * 1024 + kk * 2 * G, 1024u, G)   // wgt_off's layout
                            : wg_desc(tile_u + wg * 4 * (T * 128) + kk * 16 * 128, T * 128u, 1024u));
  wg_commit_wait();
  reg_fence(o);
}

__device__ __forceinline__ int ld_acquire_gpu(const int* ptr) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}
__device__ __forceinline__ void stsm_x4(uint32_t addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(a), "r"(b),
               "r"(c), "r"(d)
               : "memory");
}

// Bytes of shared memory a consumer warpgroup's epilogue stages its bf16 rows in (64 heads x 256 dims); the
// callers pass the Q buffer (64 x d_qk x 2 >= 2 x this), which no one reads once both loops are done.
constexpr int kWgStageBytes = 64 * 256 * 2;

// A consumer warpgroup's epilogue (wg and wgt kernels): its half of O (dims 256 wg ..; the m64n256 accumulator of
// head rows r0, r0 + 8, two adjacent dims per 8-dim group and thread) for the heads below h, normalized (scaled in
// place: the caller's o is dead after this) and written as bf16 output with the sink (splits == 1) or as the
// split's fp32 partial; warpgroup 0 also writes the lse.
// The bf16 rows go through shared memory: stmatrix puts each 8 x 8 block of the accumulator into its rows (16-byte
// chunks XOR-swizzled by row, so both sides are free of bank conflicts), then each warp copies its own 16 rows out
// in whole 512-byte rows by a loop that is not unrolled. Why (NOTES.md "Cold code"): every call meets this code
// cold; the per-row quad transposes it replaces (16-byte stores straight from registers) were ~280 instructions
// per row and warpgroup, this is ~120 for both rows, and the 128 scaling multiplies are shared by both outputs.
// Split pairs (kPairs: the wg kernels' _m variants; two splits and p.counters set: the launcher's fuse_combine): the warps holding
// the same 16 head rows x 256 dims in the two splits meet at a pair of counters. The first to arrive writes its
// fp32 partial and lse, then releases the second, which merges that partial into its registers and writes the
// output: no combine kernel, and half the partials never leave the SM. The merge is symmetric (a sum of two
// products), so the result does not depend on which split arrives first.
template <bool kPairs>
__device__ __forceinline__ void wg_write_rows(const MlaParams& p, float (&o)[128], const float (&m_run)[2],
                                              const float (&l_run)[2], int row, int split, int hblk, int r0, int wg,
                                              int t, uint8_t* stage) {
  const int lane = ((r0 & 7) << 2) | t, wq = r0 >> 4;
  int* pair = nullptr;   // split pairs: [arrivals, the first's partial written] of this warp's rows and dims
  bool merge = false;    // this warp arrived second: it merges the other split's partial and writes the output
  if (kPairs && p.splits == 2 && p.counters != nullptr) {
    pair = p.counters + 2 * (((static_cast<size_t>(row) * gridDim.y + hblk) * 2 + wg) * 4 + wq);
    int prev = 0;
    if (lane == 0) prev = atomicAdd(pair, 1);
    merge = __shfl_sync(0xffffffffu, prev, 0) != 0;
  }
  float f[2], lse_own[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int head = hblk * 64 + r0 + 8 * r;
    const bool live = head < p.h;   // rows past h write nothing (but take part in the warp's collectives)
    const float l = l_run[r];
    const float lse = row_lse(m_run[r], l);
    lse_own[r] = lse;
    f[r] = !live ? 0.f : p.splits == 1 ? out_factor(p, head, l, lse) : inv_sum(l);
    if (live && t == 0) {
      if (p.splits == 1) {
        if (wg == 0) p.lse[static_cast<size_t>(row) * p.h + head] = l > 0.f ? lse : INFINITY;
      } else if (!merge && (wg == 0 || pair != nullptr)) {   // a pair's second warp reads it whatever its wg
        p.lse_part[(static_cast<size_t>(row) * p.splits + split) * p.h + head] = lse;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] *= f[(i >> 1) & 1];

  if (p.splits != 1 && !merge) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int head = hblk * 64 + r0 + 8 * r;
      if (head >= p.h) continue;
      const size_t base = (static_cast<size_t>(row) * p.splits + split) * p.h + head;
      float* dst = p.o_part + base * kDv + wg * 256 + 2 * t;
#pragma unroll
      for (int j = 0; j < 32; ++j) *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
    }
    if (pair != nullptr) {
      __threadfence();   // this thread's partial and lse, before the release below
      __syncwarp();
      if (lane == 0) atomicExch(pair + 1, 1);
    }
    return;
  }
  if (merge) {
    if (lane == 0) {
      while (ld_acquire_gpu(pair + 1) == 0) {
      }
      pair[0] = 0;   // both counters back to zero for the next call on this stream (nobody reads them now)
      pair[1] = 0;
    }
    __syncwarp();
    __threadfence();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int head = hblk * 64 + r0 + 8 * r;
      const bool live = head < p.h;
      const size_t other = (static_cast<size_t>(row) * 2 + (split ^ 1)) * p.h + head;
      const float lse_o = live ? __ldcg(p.lse_part + other) : -INFINITY;
      const float m = fmaxf(lse_own[r], lse_o);
      float a_own = 0.f, a_other = 0.f, lse = INFINITY;   // INFINITY, O = 0: no valid entry in either split
      if (live && m != -INFINITY) {   // (rows past h: no sink to read, nothing written)
        const float w_own = __expf(lse_own[r] - m), w_other = __expf(lse_o - m);
        lse = m + __logf(w_own + w_other);
        float fin = __fdividef(1.f, w_own + w_other);
        if (p.sinks) fin = __fdividef(fin, 1.f + __expf(p.sinks[head] - lse));
        a_own = w_own * fin;
        a_other = w_other * fin;
      }
      const float* src = p.o_part + other * kDv + wg * 256 + 2 * t;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const float2 v = live ? __ldcg(reinterpret_cast<const float2*>(src + 8 * j)) : make_float2(0.f, 0.f);
        o[4 * j + 2 * r] = o[4 * j + 2 * r] * a_own + v.x * a_other;
        o[4 * j + 2 * r + 1] = o[4 * j + 2 * r + 1] * a_own + v.y * a_other;
      }
      if (live && wg == 0 && t == 0) p.lse[static_cast<size_t>(row) * p.h + head] = lse;
    }
  }

  // stmatrix x4: lanes 8m .. 8m + 7 address the rows of block m = (head row half m & 1, dim group j + (m >> 1)),
  // and each thread supplies its fragment of the four blocks in that order.
  const int i = lane & 7;
  const uint32_t stage_u = smem_u32(stage);
  const uint32_t row_u = stage_u + (16 * wq + 8 * ((lane >> 3) & 1) + i) * 512;
#pragma unroll
  for (int j = 0; j < 32; j += 2) {
    const int c = j + (lane >> 4);
    stsm_x4(row_u + ((c ^ i) << 4), pack_bf16(o[4 * j], o[4 * j + 1]), pack_bf16(o[4 * j + 2], o[4 * j + 3]),
            pack_bf16(o[4 * j + 4], o[4 * j + 5]), pack_bf16(o[4 * j + 6], o[4 * j + 7]));
  }
  __syncwarp();
  const int rows = min(16, p.h - (hblk * 64 + 16 * wq));   // this warp's rows below h
  const uint8_t* src = stage + 16 * wq * 512;
  __nv_bfloat16* dst = p.out + (static_cast<size_t>(row) * p.h + hblk * 64 + 16 * wq) * kDv + wg * 256 + 8 * lane;
#pragma unroll 4
  for (int k = 0; k < rows; ++k)
    *reinterpret_cast<uint4*>(dst + k * kDv) = *reinterpret_cast<const uint4*>(src + k * 512 + ((lane ^ (k & 7)) << 4));
}
#endif  // sm_90a

}  // namespace
