#pragma once
#include "wgmma.cuh"

namespace {

#ifdef MLA_HAS_WGMMA   // wgmma.cuh: sm_90a only
// ---- "wgt" kernels (sm_90a, fp8): 64-entry tiles gathered through registers; _t64x in the production build (the
// default at 128 heads from 64 rows), the others experimental (tuning build only) ----
//
// Why: the wg kernels are bound by their consumers' fixed cost per 32-entry tile (NOTES.md "wge kernels": cutting
// the producer's work 3x moved the time 4%): every tile pays a QK wgmma chain of n = 32, its wait, the softmax's
// shuffles and the P hand-off, and shared memory (Q, two bf16 tiles and the raw ring) leaves no room for larger
// tiles. Here the raw ring is gone (FlashMLA's Hopper design): the producer loads each entry's bytes from global
// memory straight into registers, so shared memory holds Q, two bf16 64-entry tiles and one P buffer, and every
// per-tile cost is paid once per 64 entries (QK as m64n64k16, PV in four k-steps).
//   * warpgroup 2 (producer): TPE threads per entry (wgt_body); the entries' validity goes to one byte per
//     entry next to the tile;
//   * warpgroup 0: S = Q K^T (m64n64k16), masking, online softmax, P from registers into O[:, 0:256] (PV
//     m64n256k16 x 4); it hands P (bf16) and one rescale factor per head to warpgroup 1;
//   * warpgroup 1: O[:, 256:512] with warpgroup 0's P.
// Named barriers only: tile full / free per buffer (producer + both consumers), P full / free (one buffer).
// Same equations, conversion (e4m3 x scale rounded to bf16, as the wg kernels), outputs and split protocol as
// the kernels above. Measured (H200, 2026-12-01, NOTES.md "wgt kernels"): _t64 / _t64q / _t64p / _t64c are slower
// than the wg kernels (their gathers bound them: at 128 heads each entry is loaded by both head blocks' CTAs);
// _t64x, one cluster per row's two head blocks, each entry gathered once and each converted half copied in bulk into
// the peer, is 0.84-0.88x their time at B=64 h=128.
// Registers per thread after setmaxnreg, per TPE (ptxas -v, nvcc 13.0, 2026-12-01). TPE 2: 112 / 200 / 192, no
// spills, no wgmma serialization (120 / 216 / 168 serialized the wgmmas; 104 / 216 / 184 spilled 160 B in the
// V3.2 producer). TPE 4 (two entries' shares, two index streams): 128 / 200 / 176, no spills (112 or 120 for the
// producer spilled 40-180 B). The pool is the launch allocation (168 per thread): what the consumers add must be
// what the producer releases, or setmaxnreg.inc waits forever.
// SPLIT (warpgroup 1 converts half of each tile: its raw entries and O, no P, in registers; the producer two
// half-tile sets): 120 / 192 / 192, no spills (120 / 200 / 184 spilled 44-244 B in warpgroup 1, 112 / 200 / 192
// 4-24 B).
// BAL (_t64xb): both consumer warpgroups run the same code (QK and softmax of half the tile's entries, PV of half
// the dims), so they get the same count: 200 + 176 shared as 2 x 184, the 8 left over to the producer (136).
// WIDE (V3.2's _t64x, whose producer holds a tile converted in registers beside the next one's loads: step_ahead):
// 136 / 192 / 176, 8 B of spills in the producer (2026-12-02; V4's at 128 / 200 / 176 spills 12 B; at 128 V3.2's
// spilled 36 B, and warpgroup 1 at 168 spilled inside its PV and serialized its wgmmas).
template <int TPE, bool SPLIT, bool BAL = false, bool WIDE = false>
struct WgtRegs {
  static constexpr int kProd = BAL ? 136 : SPLIT ? 120 : TPE == 2 ? 112 : WIDE ? 136 : 128,
                       kWg0 = BAL ? 184 : SPLIT ? 192 : WIDE ? 192 : 200,
                       kWg1 = BAL ? 184 : SPLIT ? 192 : TPE == 2 ? 192 : 176;
  static_assert(kProd + kWg0 + kWg1 == 3 * 168 && kWg1 >= 168, "setmaxnreg: the consumers' registers are the producer's");
};

// Most wgt kernels exist in the tuning build only: no "declared but never referenced" warning for their pieces in
// the production build.
#pragma nv_diag_suppress 177
// One 16-byte load through the non-coherent path; the L2 fetches the whole 256-byte line, so an entry's next
// chunks (read by the same thread or its partner) come from L2. volatile: issued where written, i.e. before the
// barrier the producer then waits at.
__device__ __forceinline__ uint4 ldg_nc_v4(const void* ptr) {
  uint4 r;
  asm volatile("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(ptr));
  return r;
}
__device__ __forceinline__ uint2 ldg_nc_v2(const void* ptr) {
  uint2 r;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];\n" : "=r"(r.x), "=r"(r.y) : "l"(ptr));
  return r;
}

// QK for a 64-entry tile: S (64 x 64, fp32) += A B^T, both bf16 K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t da, uint64_t db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}

// PV with P from shared memory: O (64 x 256, fp32) += A B, A (P, bf16) K-major and B (V) MN-major, both in shared
// memory (the _t64c kernels' warpgroup 1, which has no registers to spare for P).
__device__ __forceinline__ void wgmma_m64n256k16_ss(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, p, 1, 1, 0, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(1));
}

// Thread-block cluster pieces (the _t64x kernels: two CTAs, one per 64-head block, sharing every converted tile):
// this CTA's rank, a shared-memory address in the peer's window, 16 / 4 bytes stored there whose arrival
// completes that many bytes of a transaction on the peer's mbarrier, an arrival on the peer's mbarrier, a wait
// that acquires at cluster scope, and the cluster barrier (every thread of both CTAs).
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ uint32_t cluster_map(const void* ptr, uint32_t rank) {
  uint32_t d;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(smem_u32(ptr)), "r"(rank));
  return d;
}
__device__ __forceinline__ void st_async_v4(uint32_t addr, uint4 v, uint32_t mbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];\n"
               ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(mbar) : "memory");
}
__device__ __forceinline__ void st_async_b32(uint32_t addr, uint32_t v, uint32_t mbar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n"
               ::"r"(addr), "r"(v), "r"(mbar) : "memory");
}
// Bulk copy of `bytes` (a multiple of 16) from this CTA's shared memory to the peer's, completing that many bytes
// of a transaction on the peer's mbarrier.
__device__ __forceinline__ void bulk_s2peer(uint32_t dst, const void* src, uint32_t bytes, uint32_t mbar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "r"(smem_u32(src)), "r"(bytes), "r"(mbar) : "memory");
}
// An arrival on the peer's mbarrier. CTA scope (as CUTLASS's cluster pipelines arrive on a remote "empty" barrier):
// it orders nothing but the arriving warpgroup's finished reads (its wgmma waited), and at cluster scope ptxas
// fenced every arrival (ERRBAR, ncu 2026-12-02).
__device__ __forceinline__ void mbar_arrive_remote(uint32_t addr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(addr) : "memory");
}
__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

#pragma nv_diag_default 177

// What a producer thread j (of TPE per entry) holds of one entry between its load and its conversion: its share
// of the NoPE chunks (kN: V3.2 16 / 8, V4 14 / 7 for TPE 2 / 4), the scales that cover them and 8 / TPE of the
// entry's eight RoPE chunks. Which chunks (chunk(j, k)): TPE 2, the contiguous half j (as first measured); TPE 4,
// chunks j + 4 k, so that the four threads of an entry, adjacent lanes, read 64 contiguous bytes per load (a
// warp's load touches 8 entries' lines, not 32) and chunk k lies in V4 scale group k / V3.2 scale tile k / 2
// (known at compile time). Scales: V3.2 fp32, two from 2 j on (TPE 2) or all four (TPE 4); V4 the 8-byte UE8M0
// record.
template <class L, int TPE>
struct WgtRaw {
  static constexpr bool kV4 = L::kDqk == 512;
  static constexpr bool kInterleaved = TPE == 4;
  static constexpr int kN = L::kNope / (16 * TPE);
  static constexpr int kR = 8 / TPE;
  static constexpr int kS = (!kV4 && TPE == 4) ? 4 : 2;   // 32-bit scale words
  __device__ static int chunk(int j, int k) { return kInterleaved ? j + TPE * k : kN * j + k; }
  __device__ static int rope_chunk(int j, int k) { return kInterleaved ? j + TPE * k : kR * j + k; }
  uint4 w[kN];
  uint4 rope[kR];
  uint32_t scl[kS];
};

template <class L, int TPE, int PROBE>
__device__ __forceinline__ void wgt_load(const MlaParams& p, int v, int j, WgtRaw<L, TPE>& raw) {
  using R = WgtRaw<L, TPE>;
  if (v < 0 || (PROBE & 1)) {   // invalid: zeros (never read; the conversion of zeros with a unit scale gives zeros)
#pragma unroll
    for (int k = 0; k < R::kN; ++k) raw.w[k] = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < R::kR; ++k) raw.rope[k] = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int k = 0; k < R::kS; ++k) raw.scl[k] = L::kDqk == 512 ? 0x7f7f7f7fu : 0x3f800000u;   // 1.0 (UE8M0 / fp32)
    return;
  }
  const uint8_t* blk = entry_block(p, v);
  const int off = entry_offset(p, v);
  const uint8_t* rec = blk + static_cast<long long>(off) * L::kTok;
#pragma unroll
  for (int k = 0; k < R::kN; ++k) raw.w[k] = ldg_nc_v4(rec + R::chunk(j, k) * 16);
#pragma unroll
  for (int k = 0; k < R::kR; ++k) raw.rope[k] = ldg_nc_v4(rec + L::kRopeRaw + R::rope_chunk(j, k) * 16);
  if constexpr (R::kS == 4) {   // V3.2, TPE 4: all four fp32 scales
    const uint4 x = ldg_nc_v4(rec + 512);
    raw.scl[0] = x.x, raw.scl[1] = x.y, raw.scl[2] = x.z, raw.scl[3] = x.w;
  } else {
    const uint2 x = L::kDqk == 512
                        ? ldg_nc_v2(blk + (static_cast<long long>(L::kTok) << entry_page_shift(p, v)) + off * 8)
                        : ldg_nc_v2(rec + 512 + 8 * j);
    raw.scl[0] = x.x, raw.scl[1] = x.y;
  }
}


// What wgt_load would read for thread j of an entry, requested into L2 only (no registers; step_ahead's tile 1).
template <class L, int TPE>
__device__ __forceinline__ void wgt_prefetch(const MlaParams& p, int v, int j) {
  using R = WgtRaw<L, TPE>;
  if (v < 0) return;
  const uint8_t* blk = entry_block(p, v);
  const int off = entry_offset(p, v);
  const uint8_t* rec = blk + static_cast<long long>(off) * L::kTok;
#pragma unroll
  for (int k = 0; k < R::kN; ++k) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(rec + R::chunk(j, k) * 16));
#pragma unroll
  for (int k = 0; k < R::kR; ++k) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(rec + L::kRopeRaw + R::rope_chunk(j, k) * 16));
  if constexpr (L::kDqk == 512)
    asm volatile("prefetch.global.L2 [%0];\n"
                 ::"l"(blk + (static_cast<long long>(L::kTok) << entry_page_shift(p, v)) + off * 8));
}

// Chunk k's scale as fp32 and (sb) as the fast path takes it: scale x 2^112 as bf16 bits (wgt_fast_scales).
template <class L, int TPE>
__device__ __forceinline__ float wgt_chunk_scale(const WgtRaw<L, TPE>& raw, int j, int k, uint32_t& sb) {
  using R = WgtRaw<L, TPE>;
  if constexpr (L::kDqk == 512) {   // V4: UE8M0 byte c16 / 4 of the record
    const int bi = R::kInterleaved ? k : R::chunk(j, k) >> 2;   // 0..6
    const uint32_t ex = ((bi < 4 ? raw.scl[0] : raw.scl[1]) >> (8 * (bi & 3))) & 0xffu;   // no dynamic index
    sb = (ex + 112u) << 7;
    return __uint_as_float(ex << 23);
  } else {                          // V3.2: fp32 scale c16 / 8
    static_assert(R::kInterleaved || R::kN % 8 == 0, "TPE 2: a thread's chunks start at a scale tile");
    const int si = R::kInterleaved ? k >> 1 : k >> 3;
    uint32_t bits = raw.scl[0];     // selected without a dynamic index, so that raw stays in registers
#pragma unroll
    for (int i = 1; i < R::kS; ++i) bits = si == i ? raw.scl[i] : bits;
    sb = __float_as_uint(__uint_as_float(bits) * 0x1p112f) >> 16;
    return __uint_as_float(bits);
  }
}
// Every scale a thread holds takes the fast conversion (V4: the entry's whole record; V3.2: the scales of its chunks).
template <class L, int TPE>
__device__ __forceinline__ bool wgt_fast_scales(const WgtRaw<L, TPE>& raw) {
  if constexpr (L::kDqk == 512) {
    return fast_ue8m0_scales(raw.scl[0], raw.scl[1]);
  } else {
    bool fast = true;
#pragma unroll
    for (int i = 0; i < WgtRaw<L, TPE>::kS; ++i) fast &= fast_fp32_scale(raw.scl[i]);
    return fast;
  }
}

// Converts what thread j holds of entry e into row e of a bf16 tile (e4m3 x scale rounded to bf16: the fast
// path when every scale it holds takes it, wgt_fast_scales, else all of its chunks through fp32, as
// wg_convert_entry). Where a converted 16-byte chunk goes: put(byte offset in the tile buffer, value).
// The fp32 path is a loop that is not unrolled, over a copy of the chunks: the unrolled fast path is then the
// only conversion code in the producer's step, which a call fetches cold from DRAM for its first tile (its SASS
// ~2x smaller; NOTES.md "Cold code").
#pragma nv_diag_suppress 177
struct WgtPutLocal {
  uint8_t* tile;
  __device__ void operator()(int off, uint4 v) const { *reinterpret_cast<uint4*>(tile + off) = v; }
};
#pragma nv_diag_default 177
template <class L, int TPE, int PROBE, class Put>
__device__ __forceinline__ void wgt_store(const WgtRaw<L, TPE>& raw, int e, int j, const Put& put) {
  using R = WgtRaw<L, TPE>;
  if constexpr (PROBE & 2) {   // tuning probe: the raw bytes, unconverted
#pragma unroll
    for (int k = 0; k < R::kN; ++k) {
      const int c16 = R::chunk(j, k);
      put(wgt_off<L::kDqk>(e, 2 * c16), raw.w[k]);
      put(wgt_off<L::kDqk>(e, 2 * c16 + 1), make_uint4(raw.scl[0], raw.scl[1], 0, 0));
    }
  } else {
    if (wgt_fast_scales(raw)) {
#pragma unroll
      for (int k = 0; k < R::kN; ++k) {
        const int c16 = R::chunk(j, k);
        uint32_t sb;
        wgt_chunk_scale(raw, j, k, sb);
        uint4 lo, hi;
        fp8x16_to_bf16_fast(raw.w[k], sb, lo, hi);
        put(wgt_off<L::kDqk>(e, 2 * c16), lo);
        put(wgt_off<L::kDqk>(e, 2 * c16 + 1), hi);
      }
    } else {
      uint4 w[R::kN];   // indexed by the rolled loop: local memory, on this path only
#pragma unroll
      for (int k = 0; k < R::kN; ++k) w[k] = raw.w[k];
#pragma unroll 1
      for (int k = 0; k < R::kN; ++k) {
        uint32_t unused;
        uint4 lo, hi;
        fp8x16_to_bf16(w[k], wgt_chunk_scale(raw, j, k, unused), lo, hi);
        const int c16 = R::chunk(j, k);
        put(wgt_off<L::kDqk>(e, 2 * c16), lo);
        put(wgt_off<L::kDqk>(e, 2 * c16 + 1), hi);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < R::kR; ++k) put(wgt_off<L::kDqk>(e, L::kRopeChunk + R::rope_chunk(j, k)), raw.rope[k]);
}

// The cluster pair's producer converts a tile into registers before it waits for the buffer (WgtCvt, below): a
// thread's share of one entry as bf16, two 16-byte chunks per e4m3 chunk and its RoPE chunks as loaded.
template <class L>
struct WgtCvt {
  uint4 lo[WgtRaw<L, 4>::kN], hi[WgtRaw<L, 4>::kN], rope[WgtRaw<L, 4>::kR];
};
// The fast conversion (every scale of raw takes it: wgt_fast_scales) of what thread j holds, into registers.
template <class L>
__device__ __forceinline__ void wgt_convert_regs(const WgtRaw<L, 4>& raw, int j, WgtCvt<L>& cv) {
  using R = WgtRaw<L, 4>;
#pragma unroll
  for (int k = 0; k < R::kN; ++k) {
    uint32_t sb;
    wgt_chunk_scale(raw, j, k, sb);
    fp8x16_to_bf16_fast(raw.w[k], sb, cv.lo[k], cv.hi[k]);
  }
#pragma unroll
  for (int k = 0; k < R::kR; ++k) cv.rope[k] = raw.rope[k];
}
// ... and its stores into row e of a tile buffer (wgt_store's places).
template <class L>
__device__ __forceinline__ void wgt_store_regs(const WgtCvt<L>& cv, int e, int j, uint8_t* tile) {
  using R = WgtRaw<L, 4>;
#pragma unroll
  for (int k = 0; k < R::kN; ++k) {
    const int c16 = R::chunk(j, k);
    *reinterpret_cast<uint4*>(tile + wgt_off<L::kDqk>(e, 2 * c16)) = cv.lo[k];
    *reinterpret_cast<uint4*>(tile + wgt_off<L::kDqk>(e, 2 * c16 + 1)) = cv.hi[k];
  }
#pragma unroll
  for (int k = 0; k < R::kR; ++k)
    *reinterpret_cast<uint4*>(tile + wgt_off<L::kDqk>(e, L::kRopeChunk + R::rope_chunk(j, k))) = cv.rope[k];
}

// Timeline probe (PROBE bit 3): the slots of a CTA's kTlWords words. globaltimer (ns, comparable across SMs) at entry
// and exit; clock64 (SM cycles) at the phases, read by thread 0 of warpgroup 0 unless noted.
enum WgtStamp {
  kTlEntryNs = 0, kTlEntry, kTlPrologue, kTlTile0Ready, kTlTile0Qk, kTlTile0Pv, kTlLoopDone, kTlWritten,
  kTlExit, kTlExitNs, kTlProdTile0, kTlProdDone, kTlProdExit, kTlWg1Done, kTlWg1Written, kTlWaitFull,
  // sums over the tiles, cycles: the producer (thread 0) waiting for a free buffer, waiting for its entry loads,
  // converting (step_ahead: into registers), handing over (step_ahead: the tile's stores, then the fence, bulk copy
  // and barrier), issuing the next tile's loads and requesting an index; warpgroup 0's QK, softmax + PV
  kTlProdAvail, kTlProdLoads, kTlProdConvert, kTlProdHand, kTlProdIndex, kTlWg0Qk, kTlWg0SoftPv,
  // the first tiles: the producer has its indices of tiles 0 and 1, then their entries (the loads landed);
  // warpgroup 0 has Q
  kTlProdIdx01, kTlProdLoads0, kTlQReady,
  kTlSink = 30,   // two words written only if loaded values match a pattern: a use that waits for the loads
  kTlWords = 32
};

// Producer: TPE threads per entry, each holding its share of one entry per tile (TPE 2; a warp's lanes are 32
// entries) or of one entry in each half-tile (TPE 4; a warp's lanes are 8 entries x 4). The loads of tile i+1
// are issued after tile i is converted, so without PIPE each tile waits for its loads' whole latency; PIPE
// (TPE 4) issues half 0 of tile i+1 right after converting half 0 of tile i, so that its latency overlaps the
// conversion of half 1. SPLIT (TPE 4): the producer converts half 0 of every tile, holding two tiles' shares (the
// loads of tile i+2 are issued once tile i is converted, so they have two tiles' time to land), and warpgroup 1
// converts half 1 after its PV of the tile two back, in the time warpgroup 0 spends on QK and the softmax
// (the wg kernels' _c2 split); warpgroup 1 then reads P from shared memory (wgmma SS), with no registers for it.
// PROBE (tuning only; wrong results): bit 0 = the producer loads no entry, bit 1 = it stores the raw bytes
// unconverted, bit 2 = the consumers skip the wgmma instructions. Bit 3 (CLUSTER, results right): a timeline,
// WgtStamp's clock64 / globaltimer readings of each CTA into p.lse_part (unused with one split: the probe's
// caller passes a buffer of kTlWords words per CTA there; kernels/tuning/probe_timeline.py).
// PAIRS (the _m kernels): the epilogue merges split pairs (wg_write_rows<true>, used for exactly two splits).
template <class L, int TPE, bool PIPE, bool SPLIT, int PROBE, int CLUSTER = 0, bool PAIRS = false>
__device__ __forceinline__ void wgt_body(const MlaParams& p, uint8_t* smem_raw) {
  static_assert(!SPLIT || (TPE == 4 && !PIPE), "SPLIT: 4 threads per entry, two sets in the producer");
  static_assert(!CLUSTER || (TPE == 4 && !PIPE && !SPLIT), "CLUSTER: the SPLIT producer's layout, no split");
  static_assert(!PAIRS || CLUSTER != 3, "the balanced consumers' epilogue does not merge split pairs");
  constexpr bool BAL = CLUSTER == 3;   // _t64xb: the bulk exchange, consumers balanced (see the consumers below)
  constexpr bool kAhead = CLUSTER >= 2;   // the producer converts ahead of the free buffer (step_ahead)
  using Regs = WgtRegs<TPE, SPLIT, BAL, CLUSTER == 2 && L::kDqk != 512>;
  // CLUSTER 1: each converted chunk goes to the peer by st.async (16 bytes each); 2: the producer converts its half
  // locally, then each producer warp copies its 8 entries (one contiguous wgt_off entry group) to the peer in bulk.
  using S = WgtSmem<L>;
  constexpr int T = kWgtT;
  constexpr int DQK = L::kDqk;
  static_assert(L::kNope % (16 * TPE) == 0, "whole 16-byte chunks per producer thread");
  const uint32_t base_u = smem_u32(smem_raw);
  uint8_t* smem = smem_raw + (((base_u + 1023u) & ~1023u) - base_u);   // swizzle atoms need 1024 B alignment

  uint8_t* qs = smem + S::kQ;
  static_assert(S::kTile - S::kQ >= 2 * kWgStageBytes, "the epilogue stages both warpgroups' rows in Q");
  uint8_t* tiles = smem + S::kTile;
  uint4* pbuf = reinterpret_cast<uint4*>(smem + S::kP);
  float* alpha_s = reinterpret_cast<float*>(smem + S::kAlpha);
  float2* fin = reinterpret_cast<float2*>(smem + S::kFin);
  uint8_t* valid = smem + S::kValid;
  uint32_t* valid32 = reinterpret_cast<uint32_t*>(smem + S::kValid32);   // CLUSTER
  uint64_t* rready = reinterpret_cast<uint64_t*>(smem + S::kBar);        // CLUSTER: the peer's half landed [2]
  uint64_t* avail = rready + 2;                                          // CLUSTER: both CTAs done with it [2]

  const int split = blockIdx.x, hblk = blockIdx.y, row = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2;
  const int n_local = split_entries(p, split), start = split * p.per_split;
  const int ntiles = (n_local + T - 1) / T;
  constexpr bool TL = (PROBE & 8) != 0;
  uint64_t* const tl = TL ? reinterpret_cast<uint64_t*>(p.lse_part) + ((static_cast<size_t>(row) * gridDim.y + hblk) *
                                                                       gridDim.x + split) * kTlWords
                          : nullptr;
  auto stamp = [&](int slot, bool who) {
    if constexpr (TL) {
      if (who) tl[slot] = slot == kTlEntryNs || slot == kTlExitNs ? globaltimer_ns() : clock64();
    }
  };
  stamp(kTlEntryNs, tid == 0);
  stamp(kTlEntry, tid == 0);
  uint64_t tl_t = 0;   // TL: the last clock64 of this thread, and its per-phase sums
  auto lap = [&](int slot) {
    if constexpr (TL) {
      const uint64_t now = clock64();
      if (tid == 0 || tid == 256) tl[slot] += now - tl_t;
      tl_t = now;
    }
  };

  // CLUSTER: the peer CTA (the other 64-head block of the row); this CTA's producer thread converts entry
  // 32 rank + pe of every tile, chunks pj + 4 k.
  const uint32_t peer = CLUSTER ? cluster_rank() ^ 1u : 0u;
  const int pe = 32 * static_cast<int>(peer ^ 1u) + 8 * ((tid - 256) >> 5) + (lane >> 2), pj = lane & 3;
  auto index_of = [&](int x) { return x * T + pe < n_local ? load_index(p, row, start + x * T + pe) : -1; };
  // Q block (heads past h are zero) into the swizzled layout.
  auto load_q = [&](int from, int nthr) {
    q_block_async<DQK>(p, row, hblk * 64, 64, from, nthr, [&](int r, int c) { return qs + wg_swz<64>(r, c); });
    cp_async_commit();
    cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // Q: async-copied -> wgmma reads
  };
  // CLUSTER: the producer's first two tiles are requested first (both indices, then their entries into registers),
  // and Q only once those loads are out (warpgroup 0, after kBarQGo), so that tile 0's entries are not queued behind
  // Q's 72 KB per CTA in DRAM. Measured (NOTES.md "The cluster pair's timeline"): neutral, 0.96-1.00x; tile 0's
  // entries land ~4 us after entry either way, and its first conversion waits for the producer's code (cold
  // instruction cache), not for Q.
  WgtRaw<L, 4> ra, rb;   // CLUSTER producer: even and odd tiles
  int va = -1, vb = -1;
  if constexpr (CLUSTER) {
    if (wg == 2) {   // both loads issued before either is checked
      if (pe < n_local) va = __ldg(index_src(p, row, start + pe));
      if (T + pe < n_local) vb = __ldg(index_src(p, row, start + T + pe));
    }
  } else {
    load_q(tid, kWgThreads);
  }
  if constexpr (CLUSTER) {
    if (tid == 0) {
      for (int b = 0; b < 2; ++b) {
        mbar_init(rready + b, 1);   // this CTA's producer (expect_tx of the peer's bytes)
        mbar_init(avail + b, 4);    // warpgroups 0 and 1 of both CTAs
      }
      mbar_fence_init();
    }
    __syncthreads();
    cluster_sync_all();   // both CTAs' barriers exist before either touches the other's
    stamp(kTlPrologue, tid == 0);
  } else {
    __syncthreads();
  }
  // CLUSTER: the bytes the peer stores here per tile.
  constexpr uint32_t kPeerBytes = 32 * (2 * DQK + 4);
  // The waits on rready and avail acquire at CTA scope, as CUTLASS's cluster pipelines wait on barriers that a TMA
  // multicast fills or remote consumers arrive on: the peer's bytes land through the async proxy's complete_tx, and
  // an arrival follows finished reads. At cluster scope ptxas invalidated the L1 at every wait (CCTL.IVALL), which
  // also waited for the producer's loads of the next tile in flight (ncu 2026-12-02, NOTES.md "The cluster pair's
  // waits").
  auto wait_peer_half = [&](int it) {
    if constexpr (CLUSTER) mbar_wait(rready + (it & 1), (it >> 1) & 1);
  };
  // End of a consumer warpgroup's tile it: buffer it & 1 is free for the producers (both CTAs' with CLUSTER).
  auto release = [&](int it) {
    if (it + 2 >= ntiles) return;
    if constexpr (CLUSTER) {
      if ((tid & 127) == 0) {
        mbar_arrive(avail + (it & 1));
        mbar_arrive_remote(cluster_map(avail + (it & 1), peer));
      }
    } else {
      bar_arrive(kBarFree + (it & 1), kWgThreads);
    }
  };

  if (wg == 2) {
    // ---------------- producer ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs::kProd) : "memory");
    const int ptid = tid - 256;
    if constexpr (CLUSTER) {
      // Half `rank` of every tile (entries 32 rank + 8 w ..), converted into this CTA's buffer and into the peer's
      // (bulk copies, or with CLUSTER 1 st.async, completing bytes on the peer's rready): each entry gathered and
      // converted once per row.
      const uint32_t rank = peer ^ 1u;
      const int e = pe, j = pj;
      va = pe < n_local ? index_check(p, start + pe, va) : -1;   // the indices of tiles 0 and 1 (prologue)
      vb = T + pe < n_local ? index_check(p, start + T + pe, vb) : -1;
      if constexpr (TL) {
        if (ptid == 0 && va == 0x7ffffff0 && vb == 0x7ffffff1) tl[kTlSink] = 1;   // a use: the indices are here
      }
      stamp(kTlProdIdx01, ptid == 0);
      if (ntiles > 0) wgt_load<L, 4, PROBE>(p, va, j, ra);
      if constexpr (kAhead) {
        if (ntiles > 1) wgt_prefetch<L, 4>(p, vb, j);   // one raw set (step_ahead): tile 1 into L2 for now
      } else {
        if (ntiles > 1) wgt_load<L, 4, PROBE>(p, vb, j, rb);
      }
      bar_arrive(kBarQGo, 256);                      // tile 0's and 1's requests are out: Q may follow
      using R4 = WgtRaw<L, 4>;
      const uint32_t peer_tiles = cluster_map(tiles, peer), peer_valid = cluster_map(valid32, peer);
      const uint32_t peer_rready = cluster_map(rready, peer);
      // CLUSTER 1 (_t64xs, tuning build): two raw sets, each tile converted after the wait for its buffer, every
      // converted chunk stored here and by st.async into the peer.
      auto step = [&](int it, WgtRaw<L, 4>& raw, int& v) {
        const int b = it & 1;
        lap(kTlProdIndex);
        if (it >= 2) mbar_wait(avail + b, ((it >> 1) - 1) & 1);   // both CTAs are done with tile it-2
        lap(kTlProdAvail);
        if constexpr (TL) {   // wait for this tile's loads (a use of its registers), apart from the conversion
          if (raw.w[0].x == 0x12345678u && raw.w[R4::kN - 1].w == 0x9abcdef0u && raw.rope[0].x == 1u)
            tl[kTlSink + 1] = 1;
        }
        lap(kTlProdLoads);
        if (it == 0) stamp(kTlProdLoads0, ptid == 0);
        if (ptid == 0) mbar_arrive_expect_tx(rready + b, kPeerBytes);     // the peer's half of tile it
        uint8_t* tile = tiles + b * S::kTileBytes;
        const uint32_t ptile = peer_tiles + b * S::kTileBytes, pbar = peer_rready + 8 * b;
        wgt_store<L, 4, PROBE>(raw, e, j, [&](int off, uint4 x) {
          *reinterpret_cast<uint4*>(tile + off) = x;
          st_async_v4(ptile + off, x, pbar);
        });
        if (j == 0) {
          valid32[b * T + e] = v >= 0;
          st_async_b32(peer_valid + 4 * (b * T + e), v >= 0, pbar);
        }
        lap(kTlProdConvert);
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // tile: generic stores -> wgmma reads
        bar_arrive(kBarFull + b, kWgThreads);                             // this CTA's half of tile it
        if (it == 0) stamp(kTlProdTile0, ptid == 0);
        lap(kTlProdHand);
        if (it + 2 < ntiles) wgt_load<L, 4, PROBE>(p, v = index_of(it + 2), j, raw);
      };
      // kAhead (the bulk pair): each tile is converted into registers (cv) as soon as its entries are here, the
      // next tile's loads go out into the same raw registers, and only then does the producer wait for the buffer:
      // what is left between a buffer's release and its refill is the stores and the hand-over, not the conversion
      // (NOTES.md "Converting ahead of the free buffer"). One raw set: a second would add nothing, as every entry
      // load of the producer waits on one scoreboard (NOTES.md "The cluster pair's timeline"). A warp with a
      // scale off the fast path converts after the wait, as step() does, and loads the next tile after that.
      // V3.2's larger share (8 chunks and four fp32 scales) takes 136 producer registers (WgtRegs WIDE): at 128
      // it spilled and measured no faster.
      // The index of tile it+1 as loaded (unchecked), requested at step it-1 right after that step's entry loads:
      // it shares their scoreboard, so the conversion that waits for them has it too, and the next tile's loads
      // go out without a round trip to L2 for their index (~0.6 us per tile in the timeline before; NOTES.md
      // "Converting ahead of the free buffer"). A step-ahead index with two raw sets had been slower (NOTES.md
      // "The cluster pair's timeline"), and a list in shared memory (V4 only: V3.2 has no room) was 1-4% slower.
      int idx_ahead = -1;
      auto step_ahead = [&](int it, WgtRaw<L, 4>& raw, int& v) {
        const int b = it & 1;
        if constexpr (TL) {   // wait for this tile's loads (a use of its registers), apart from the conversion
          if (raw.w[0].x == 0x12345678u && raw.w[R4::kN - 1].w == 0x9abcdef0u && raw.rope[0].x == 1u)
            tl[kTlSink + 1] = 1;
        }
        lap(kTlProdLoads);
        if (it == 0) stamp(kTlProdLoads0, ptid == 0);
        const int v_cur = v;
        const bool fast = __all_sync(0xffffffffu, wgt_fast_scales(raw));
        WgtCvt<L> cv;
        auto load_next = [&] {
          if (it + 1 >= ntiles) return;
          const int pos = (it + 1) * T + pe;
          wgt_load<L, 4, PROBE>(p, v = it == 0 ? vb : index_check(p, start + pos, idx_ahead), j, raw);
          if (it + 2 < ntiles) {
            const int pos2 = pos + T;
            idx_ahead = ldg_index_if(index_src(p, row, start + min(pos2, n_local - 1)), pos2 < n_local);
          }
        };
        if (fast) wgt_convert_regs(raw, j, cv);
        lap(kTlProdConvert);
        if (fast) load_next();
        lap(kTlProdIndex);
        if (it >= 2) mbar_wait(avail + b, ((it >> 1) - 1) & 1);   // both CTAs are done with tile it-2
        lap(kTlProdAvail);
        if (ptid == 0) mbar_arrive_expect_tx(rready + b, kPeerBytes);     // the peer's half of tile it
        uint8_t* tile = tiles + b * S::kTileBytes;
        const uint32_t ptile = peer_tiles + b * S::kTileBytes, pbar = peer_rready + 8 * b;
        if (fast) {
          wgt_store_regs(cv, e, j, tile);
        } else {
          wgt_store<L, 4, PROBE>(raw, e, j, WgtPutLocal{tile});
          load_next();
        }
        if (j == 0) valid32[b * T + e] = v_cur >= 0;
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // tile: generic stores -> wgmma / bulk reads
        // Each warp sends its own 8 entries as soon as they are in this CTA's buffer (no wait for the other producer
        // warps): entries 32 rank + 8 w .. + 7, one entry group of wgt_off's layout, in one copy.
        __syncwarp();
        if (lane == 0) {
          const int rows = 32 * static_cast<int>(rank) + 8 * (ptid >> 5), off = rows / 8 * kWgtGroup<DQK>;
          bulk_s2peer(ptile + off, tile + off, kWgtGroup<DQK>, pbar);
          bulk_s2peer(peer_valid + 4 * (b * T + rows), valid32 + b * T + rows, 8 * 4, pbar);
        }
        bar_arrive(kBarFull + b, kWgThreads);                             // this CTA's half of tile it
        if (it == 0) stamp(kTlProdTile0, ptid == 0);
        lap(kTlProdHand);
      };
      if constexpr (TL) tl_t = clock64();
      if constexpr (kAhead) {
        static_assert((PROBE & 3) == 0, "the convert-ahead producer loads and converts every entry");
        for (int it = 0; it < ntiles; ++it) step_ahead(it, ra, va);
      } else {
        for (int it = 0; it < ntiles; it += 2) {
          step(it, ra, va);
          if (it + 1 < ntiles) step(it + 1, rb, vb);
        }
      }
      stamp(kTlProdDone, ptid == 0);
      cluster_sync_all();   // neither CTA leaves while the other may still reach into it
      stamp(kTlProdExit, ptid == 0);
      return;
    } else if constexpr (SPLIT) {
      const int e = 8 * (ptid >> 5) + ((ptid & 31) >> 2), j = ptid & 3;   // half 0: warp w, entries 8 w .. 8 w + 7
      auto index_of = [&](int x) { return x * T + e < n_local ? load_index(p, row, start + x * T + e) : -1; };
      WgtRaw<L, 4> ra, rb;                           // even and odd tiles
      int va = -1, vb = -1;
      if (ntiles > 0) wgt_load<L, 4, PROBE>(p, va = index_of(0), j, ra);
      if (ntiles > 1) wgt_load<L, 4, PROBE>(p, vb = index_of(1), j, rb);
      auto step = [&](int it, WgtRaw<L, 4>& raw, int& v) {
        const int b = it & 1;
        if (it >= 2) bar_sync(kBarFree + b, kWgThreads);   // both consumers are done with tile it-2
        wgt_store<L, 4, PROBE>(raw, e, j, WgtPutLocal{tiles + b * S::kTileBytes});
        if (j == 0) valid[b * T + e] = v >= 0;
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // tile: generic stores -> wgmma reads
        bar_arrive(kBarFull + b, kWgThreads);
        if (it + 2 < ntiles) wgt_load<L, 4, PROBE>(p, v = index_of(it + 2), j, raw);
      };
      for (int it = 0; it < ntiles; it += 2) {   // two steps per trip: each register set is named statically
        step(it, ra, va);
        if (it + 1 < ntiles) step(it + 1, rb, vb);
      }
    } else if constexpr (TPE == 2) {
      const int e = ptid & (T - 1), j = ptid >> 6;   // a warp: 32 entries, one half of each
      auto index_of = [&](int x) { return x * T + e < n_local ? load_index(p, row, start + x * T + e) : -1; };
      WgtRaw<L, 2> raw;
      int v = index_of(0);
      int v_next = ntiles > 1 ? index_of(1) : -1;
      if (ntiles > 0) wgt_load<L, 2, PROBE>(p, v, j, raw);
      for (int it = 0; it < ntiles; ++it) {
        const int b = it & 1;
        if (it >= 2) bar_sync(kBarFree + b, kWgThreads);   // both consumers are done with tile it-2
        wgt_store<L, 2, PROBE>(raw, e, j, WgtPutLocal{tiles + b * S::kTileBytes});
        if (j == 0) valid[b * T + e] = v >= 0;
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // tile: generic stores -> wgmma reads
        bar_arrive(kBarFull + b, kWgThreads);
        if (it + 1 < ntiles) {   // tile it+1 in flight while the consumers work
          v = v_next;
          v_next = it + 2 < ntiles ? index_of(it + 2) : -1;
          wgt_load<L, 2, PROBE>(p, v, j, raw);
        }
      }
    } else {
      static_assert(TPE == 4, "2 or 4 threads per entry");
      const int e = 8 * (ptid >> 5) + ((ptid & 31) >> 2), j = ptid & 3;   // warp w: entries 8 w .. 8 w + 7 of a half
      auto index_of = [&](int x, int half) {
        const int pos = x * T + 32 * half + e;
        return pos < n_local ? load_index(p, row, start + pos) : -1;
      };
      WgtRaw<L, 4> ra, rb;                           // halves 0 and 1 of a tile
      int va = index_of(0, 0), vb = index_of(0, 1);
      int va_next = ntiles > 1 ? index_of(1, 0) : -1, vb_next = ntiles > 1 ? index_of(1, 1) : -1;
      if (ntiles > 0) {
        wgt_load<L, 4, PROBE>(p, va, j, ra);
        wgt_load<L, 4, PROBE>(p, vb, j, rb);
      }
      auto next_a = [&](int it) {
        va = va_next;
        va_next = it + 2 < ntiles ? index_of(it + 2, 0) : -1;
        wgt_load<L, 4, PROBE>(p, va, j, ra);
      };
      auto next_b = [&](int it) {
        vb = vb_next;
        vb_next = it + 2 < ntiles ? index_of(it + 2, 1) : -1;
        wgt_load<L, 4, PROBE>(p, vb, j, rb);
      };
      for (int it = 0; it < ntiles; ++it) {
        const int b = it & 1;
        uint8_t* tile = tiles + b * S::kTileBytes;
        if (it >= 2) bar_sync(kBarFree + b, kWgThreads);   // both consumers are done with tile it-2
        wgt_store<L, 4, PROBE>(ra, e, j, WgtPutLocal{tile});
        if (j == 0) valid[b * T + e] = va >= 0;
        // PIPE: half 0 of tile it+1 in flight while half 1 of tile it is converted
        if (PIPE && it + 1 < ntiles) next_a(it);
        wgt_store<L, 4, PROBE>(rb, 32 + e, j, WgtPutLocal{tile});
        if (j == 0) valid[b * T + 32 + e] = vb >= 0;
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // tile: generic stores -> wgmma reads
        bar_arrive(kBarFull + b, kWgThreads);
        if (it + 1 < ntiles) {
          if (!PIPE) next_a(it);
          next_b(it);
        }
      }
    }
    return;
  }

  // ---------------- consumers ----------------
  const int ctid = tid & 127;             // thread within the warpgroup
  const int r0 = (warp & 3) * 16 + g;     // this thread's head rows r0, r0 + 8 within the block
  const uint32_t q_u = smem_u32(qs), tiles_u = smem_u32(tiles);
  // V read MN-major: leading byte offset = between 64-dim column blocks, stride byte offset = between 8-entry
  // groups (as in the wg kernels).
  constexpr uint32_t kVLbo = 1024u, kVSbo = kWgtGroup<DQK>;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  // CLUSTER: warpgroup 0 requests Q once the producer's first loads are out, and both consumer warpgroups wait for it.
  auto await_q = [&] {
    if constexpr (CLUSTER) {
      if (wg == 0) {
        bar_sync(kBarQGo, 256);
        load_q(ctid, 128);
      }
      bar_sync(kBarQ, 256);
    }
  };

  // O[:, 256 wg .. + 256] += P V for the tile at tile_u (four k-steps of 16 entries), after rescaling O.
  auto pv = [&](const uint32_t (&a)[4][4], const float (&alpha)[2], uint32_t tile_u) {
    wg_pv_step<false, T, PROBE & 4 ? 0 : 4, 4, kWgtGroup<DQK>>(o, a, alpha, tile_u, wg);
  };

  // BAL: the two warpgroups share every tile's work evenly instead of warpgroup 1 waiting while warpgroup 0 computes
  // QK and the softmax (13.5% of its samples, NOTES.md "The cluster pair's waits"). Warpgroup W computes S for
  // entries 32 W .. 32 W + 31 (m64n32k16 over the whole d_qk), the two exchange their row maxima through shared
  // memory, so both hold the same running maximum, and each turns its S into P for its 32 entries, which are its
  // A fragments of k-steps 2 W, 2 W + 1; it publishes them in the P buffer, takes the other two k-steps from there
  // and runs PV for its 256 dims over all 64 entries. Each keeps the sum of its own entries; the two sums are added
  // in the epilogue. Barriers per tile (256 threads): kBarPFree = maxima written, kBarPFull = P halves written.
  // The next tile's writes are ordered after the other warpgroup's reads by those barriers: a warpgroup reaches the
  // maxima barrier of tile it+1 only after it has read the P half and the maximum of tile it.
  if constexpr (BAL) {
    float* xm = reinterpret_cast<float*>(fin);   // [2 warpgroups][64 rows]: tile maxima, then the sums
    auto consume = [&](auto wg_c) {
      constexpr int W = decltype(wg_c)::value, E0 = 32 * W;
      await_q();
      for (int it = 0; it < ntiles; ++it) {
        const int b = it & 1;
        const uint32_t tile_u = tiles_u + b * S::kTileBytes;
        bar_sync(kBarFull + b, kWgThreads);
        wait_peer_half(it);
        float s[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) s[i] = 0.f;
        wg_fence();
#pragma unroll
        for (int k = 0; k < (PROBE & 4 ? 0 : DQK / 16); ++k) {
          const uint32_t ko = (k & 3) * 32u;   // k-step within the 128-byte row
          wgmma_m64n32k16_ss(s, wg_desc(q_u + (k >> 2) * (64 * 128) + ko, 16, 1024),
                             wg_desc(tile_u + (k >> 2) * 1024 + E0 / 8 * kWgtGroup<DQK> + ko, 16, kWgtGroup<DQK>), k);
        }
        wg_commit_wait();
        reg_fence(s);
        // s[4 jj + q]: head r0 (q < 2) or r0 + 8, entry E0 + 8 jj + 2 t + (q & 1).
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const bool ok = valid32[b * T + E0 + 8 * jj + 2 * t + (q & 1)] != 0;
            s[4 * jj + q] = ok ? s[4 * jj + q] * p.scale_log2 : -INFINITY;
            mx[q >> 1] = fmaxf(mx[q >> 1], s[4 * jj + q]);
          }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
          mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        }
        if (t == 0) {
          xm[W * 64 + r0] = mx[0];
          xm[W * 64 + r0 + 8] = mx[1];
        }
        bar_sync(kBarPFree, 256);
        float m_use[2], alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {   // both warpgroups compute the same maximum, so the same alpha
          const float m_new = fmaxf(m_run[r], fmaxf(mx[r], xm[(W ^ 1) * 64 + r0 + 8 * r]));
          m_use[r] = m_new == -INFINITY ? 0.f : m_new;   // nothing valid yet: exp2(-inf - 0) = 0, never NaN
          alpha[r] = exp2f(m_run[r] - m_use[r]);
          m_run[r] = m_new;
        }
        WG_EXP_SUM(s, 16, m_use, alpha, l_run);
        uint32_t a[4][4];
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          uint32_t* x = a[2 * W + kk];
          x[0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
          x[1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
          x[2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
          x[3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
          pbuf[(2 * W + kk) * 128 + ctid] = make_uint4(x[0], x[1], x[2], x[3]);
        }
        bar_sync(kBarPFull, 256);
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {   // same thread layout in both warpgroups: thread ctid's rows and entries
          const uint4 x = pbuf[(2 * (W ^ 1) + kk) * 128 + ctid];
          uint32_t* y = a[2 * (W ^ 1) + kk];
          y[0] = x.x;
          y[1] = x.y;
          y[2] = x.z;
          y[3] = x.w;
        }
        wg_pv_step<false, T, PROBE & 4 ? 0 : 4, 4, kWgtGroup<DQK>>(o, a, alpha, tile_u, W);
        release(it);
      }
      // Epilogue: the row sums of both halves (every read of xm above precedes the first barrier).
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
      }
      bar_sync(kBarFin, 256);
      if (t == 0) {
        xm[W * 64 + r0] = l_run[0];
        xm[W * 64 + r0 + 8] = l_run[1];
      }
      bar_sync(kBarFin, 256);
      const float l_tot[2] = {l_run[0] + xm[(W ^ 1) * 64 + r0], l_run[1] + xm[(W ^ 1) * 64 + r0 + 8]};
      wg_write_rows<false>(p, o, m_run, l_tot, row, split, hblk, r0, W, t, qs + W * kWgStageBytes);
      cluster_sync_all();
    };
    if (wg == 0) {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs::kWg0) : "memory");
      consume(std::integral_constant<int, 0>{});
    } else {
      asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs::kWg1) : "memory");
      consume(std::integral_constant<int, 1>{});
    }
    return;
  }

  if (wg == 0) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs::kWg0) : "memory");
    await_q();
    stamp(kTlQReady, tid == 0);
    uint64_t waited = 0;   // TL: cycles warpgroup 0 waited for full tiles
    for (int it = 0; it < ntiles; ++it) {
      const int b = it & 1;
      const uint32_t tile_u = tiles_u + b * S::kTileBytes;
      const uint64_t w0 = TL ? clock64() : 0;
      bar_sync(kBarFull + b, kWgThreads);
      wait_peer_half(it);
      if constexpr (TL) {
        waited += clock64() - w0;
        tl_t = clock64();
      }
      if (it == 0) stamp(kTlTile0Ready, tid == 0);
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = 0.f;
      wg_fence();
#pragma unroll
      for (int k = 0; k < (PROBE & 4 ? 0 : DQK / 16); ++k) {
        const uint32_t ko = (k & 3) * 32u;   // k-step within the 128-byte row
        wgmma_m64n64k16_ss(s, wg_desc(q_u + (k >> 2) * (64 * 128) + ko, 16, 1024),
                           wg_desc(tile_u + (k >> 2) * 1024 + ko, 16, kWgtGroup<DQK>), k);
      }
      wg_commit_wait();
      reg_fence(s);
      if (it == 0) stamp(kTlTile0Qk, tid == 0);
      lap(kTlWg0Qk);
      // s[4 jj + q]: head r0 (q < 2) or r0 + 8, entry 8 jj + 2 t + (q & 1).
      const uint8_t* vb = valid + b * T;
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int jj = 0; jj < 8; ++jj)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int en = 8 * jj + 2 * t + (q & 1);
          const bool ok = CLUSTER ? valid32[b * T + en] != 0 : vb[en] != 0;
          s[4 * jj + q] = ok ? s[4 * jj + q] * p.scale_log2 : -INFINITY;
          mx[q >> 1] = fmaxf(mx[q >> 1], s[4 * jj + q]);
        }
      float m_use[2], alpha[2];
      wg_row_max_update(mx, m_run, m_use, alpha);
      WG_EXP_SUM(s, 32, m_use, alpha, l_run);
      uint32_t a[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        a[kk][0] = pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
        a[kk][1] = pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
        a[kk][2] = pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
        a[kk][3] = pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
      }
      if (it >= 1) bar_sync(kBarPFree, 256);   // warpgroup 1 has read P of tile it-1
      if constexpr (SPLIT) {
        // P as the K-major, 128B-swizzled A operand of warpgroup 1's wgmma: row r (head), entry c at
        // r * 128 + ((c / 8) ^ (r % 8)) * 16 + (c % 8) * 2; a[kk][q] holds row r0 + 8 (q & 1), entries
        // 8 (2 kk + q / 2) + 2 t, + 1 (conflict-free: the 32 lanes hit 32 banks).
        uint8_t* ps = reinterpret_cast<uint8_t*>(pbuf);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int r = r0 + 8 * (q & 1), jj = 2 * kk + (q >> 1);
            *reinterpret_cast<uint32_t*>(ps + r * 128 + ((jj ^ (r & 7)) << 4) + 4 * t) = a[kk][q];
          }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // P: generic stores -> wgmma reads
      } else {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) pbuf[kk * 128 + ctid] = make_uint4(a[kk][0], a[kk][1], a[kk][2], a[kk][3]);
      }
      if (t == 0) {
        alpha_s[r0] = alpha[0];
        alpha_s[r0 + 8] = alpha[1];
      }
      bar_arrive(kBarPFull, 256);
      pv(a, alpha, tile_u);
      if (it == 0) stamp(kTlTile0Pv, tid == 0);
      lap(kTlWg0SoftPv);
      release(it);
    }
    stamp(kTlLoopDone, tid == 0);
    if constexpr (TL) {
      if (tid == 0) tl[kTlWaitFull] = waited;
    }
    // Epilogue: complete the sums and hand (m, l) of each head row to warpgroup 1.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
    if (t == 0) {
      fin[r0] = make_float2(m_run[0], l_run[0]);
      fin[r0 + 8] = make_float2(m_run[1], l_run[1]);
    }
    bar_arrive(kBarFin, 256);
    wg_write_rows<PAIRS>(p, o, m_run, l_run, row, split, hblk, r0, wg, t, qs + wg * kWgStageBytes);
    stamp(kTlWritten, tid == 0);
    if constexpr (CLUSTER) cluster_sync_all();
    stamp(kTlExit, tid == 0);
    stamp(kTlExitNs, tid == 0);
  } else if constexpr (SPLIT) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs::kWg1) : "memory");
    const int e = 32 + 8 * (ctid >> 5) + ((ctid & 31) >> 2), j = ctid & 3;   // half 1: entries 32 + 8 w ..
    auto index_of = [&](int x) { return x * T + e < n_local ? load_index(p, row, start + x * T + e) : -1; };
    WgtRaw<L, 4> raw;
    int v = -1;
    auto convert = [&](int x) {   // half 1 of tile x into buffer x & 1, then its share of "tile full"
      const int b = x & 1;
      wgt_store<L, 4, PROBE>(raw, e, j, WgtPutLocal{tiles + b * S::kTileBytes});
      if (j == 0) valid[b * T + e] = v >= 0;
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // tile: generic stores -> wgmma reads
      bar_arrive(kBarFull + b, kWgThreads);
    };
    for (int x = 0; x < min(ntiles, 2); ++x) {
      wgt_load<L, 4, PROBE>(p, v = index_of(x), j, raw);
      convert(x);
    }
    if (ntiles > 2) wgt_load<L, 4, PROBE>(p, v = index_of(2), j, raw);
    const uint32_t p_u = smem_u32(pbuf);
    for (int it = 0; it < ntiles; ++it) {
      const int b = it & 1;
      const uint32_t tile_u = tiles_u + b * S::kTileBytes;
      bar_sync(kBarPFull, 256);   // P of tile it (and so both halves of the tile) ready
      const float alpha[2] = {alpha_s[r0], alpha_s[r0 + 8]};
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] *= alpha[(i >> 1) & 1];
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < (PROBE & 4 ? 0 : 4); ++kk)
        wgmma_m64n256k16_ss(o, wg_desc(p_u + kk * 32, 16, 1024),
                            wg_desc(tile_u + 4 * 1024 + kk * 2 * kWgtGroup<DQK>, kVLbo, kVSbo));
      wg_commit_wait();
      reg_fence(o);
      if (it + 1 < ntiles) bar_arrive(kBarPFree, 256);   // P read (by the wgmma) before warpgroup 0 rewrites it
      if (it + 2 < ntiles) {
        bar_sync(kBarFree + b, kWgThreads);   // warpgroup 0 is done with tile it too
        convert(it + 2);
        if (it + 3 < ntiles) wgt_load<L, 4, PROBE>(p, v = index_of(it + 3), j, raw);
      }
    }
    bar_sync(kBarFin, 256);
    const float2 f0 = fin[r0], f1 = fin[r0 + 8];
    m_run[0] = f0.x; l_run[0] = f0.y;
    m_run[1] = f1.x; l_run[1] = f1.y;
    wg_write_rows<PAIRS>(p, o, m_run, l_run, row, split, hblk, r0, wg, t, qs + wg * kWgStageBytes);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs::kWg1) : "memory");
    await_q();
    for (int it = 0; it < ntiles; ++it) {
      const int b = it & 1;
      bar_sync(kBarFull + b, kWgThreads);
      wait_peer_half(it);
      bar_sync(kBarPFull, 256);
      uint32_t a[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint4 x = pbuf[kk * 128 + ctid];
        a[kk][0] = x.x;
        a[kk][1] = x.y;
        a[kk][2] = x.z;
        a[kk][3] = x.w;
      }
      const float alpha[2] = {alpha_s[r0], alpha_s[r0 + 8]};
      if (it + 1 < ntiles) bar_arrive(kBarPFree, 256);
      pv(a, alpha, tiles_u + b * S::kTileBytes);
      release(it);
    }
    stamp(kTlWg1Done, tid == 128);
    bar_sync(kBarFin, 256);
    const float2 f0 = fin[r0], f1 = fin[r0 + 8];
    m_run[0] = f0.x; l_run[0] = f0.y;
    m_run[1] = f1.x; l_run[1] = f1.y;
    wg_write_rows<PAIRS>(p, o, m_run, l_run, row, split, hblk, r0, wg, t, qs + wg * kWgStageBytes);
    stamp(kTlWg1Written, tid == 128);
    if constexpr (CLUSTER) cluster_sync_all();
  }
}
#endif  // MLA_HAS_WGMMA

}  // namespace
