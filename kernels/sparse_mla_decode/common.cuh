#pragma once
// Sparse MLA decode (DeepSeek-V4-Flash and V3.2), sm_90a / sm_120a: what every kernel family shares.
// The families are one file each (first.cuh, ds.cuh, wg.cuh, wge.cuh, wgt.cuh, combine.cuh); sparse_mla_decode.cu
// is the one translation unit that includes them and instantiates the kernels the fatbin exports.
//
//
// For each query row r (= b * next_n + j), each head h of the CTA's head block and the row's selected KV
// entries e (indices >= 0; -1 = invalid, skipped):
//   s[h, e] = sm_scale * q[r, h, :] . k[e, :]          (d_qk = 512 for V4, 576 for V3.2)
//   lse[h]  = log sum_e exp(s[h, e])                   (natural log, over valid entries only)
//   o[h, :] = sum_e exp(s[h, e] - lse[h]) * v[e, :] / (1 + exp(sink[h] - lse[h]))   (d_v = 512)
// A row with no valid entry gets o = 0 and lse = +inf (FlashMLA's convention). One KV head: v = k[:, :512]
// (V4: K = V, the whole 512-dim entry including its 64 RoPE dims; V3.2: the 512 latent dims).
//
// KV cache layouts (bytes; entry index = physical_block * page + offset, page a power of two):
//   V4  (FlashMLA MODEL1_FP8Sparse, 584 B/entry): per block, page x 576 B of data first (448 e4m3 NoPE,
//        then 64 bf16 RoPE), then page x 8 B of scales (7 UE8M0 bytes, one per 64 NoPE dims, 1 pad byte).
//   V3.2 (FlashMLA V32_FP8Sparse, 656 B/entry, contiguous per entry): 512 e4m3, 4 fp32 scales (one per
//        128 dims), 64 bf16 RoPE.
//   The block stride is a parameter (FlashMLA pads V4 blocks to a multiple of 576 B, V3.2 blocks by one
//   entry). Entries come from two sources: `kv` with `indices` [rows, topk] and optionally `kv_extra`
//   with `indices_extra` [rows, topk_extra] (V4's sliding-window cache); both use the same layout.
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <type_traits>

// smem_u32, griddep_*, cp_async_commit / _wait (shared with the indexer).
#include "../common/ptx.cuh"
// MlaParams, the layouts' geometry, the shared-memory layouts and the kernel tables.
#include "sparse_mla_decode.h"

namespace {

constexpr int kExtraBit = 1 << 30;   // marks an index of the extra source in the CTA's index list

// Whether a scale takes the wg kernels' fast conversion (scale x 2^112 an exact, normal bf16): a UE8M0 exponent
// byte up to 142 (scale <= 2^15), an fp32 scale with at most 8 significant bits in bf16's normal range.
__device__ __forceinline__ bool fast_fp32_scale(uint32_t bits) {
  const uint32_t b = __float_as_uint(__uint_as_float(bits) * 0x1p112f);
  return (b & 0xffffu) == 0 && ((b >> 23) & 0xffu) - 1u < 254u;
}
// V4's 8-byte scale record (bytes 0-6 the seven UE8M0 exponents, byte 7 unused) as two words.
__device__ __forceinline__ bool fast_ue8m0_scales(uint32_t lo, uint32_t hi) {
  return (__vcmpgtu4(lo, 0x8e8e8e8eu) | (__vcmpgtu4(hi, 0x8e8e8e8eu) & 0x00ffffffu)) == 0;
}

// Device-side readers of each cache layout (the geometry is in the header). scale_bf16_112, fast_scales and
// fp8x2_to_bf16x2_fast serve only the wg kernels, which the sm_120a pass compiles to a trap: no "declared but
// never referenced" warning for them there.
#pragma nv_diag_suppress 177
struct LayoutV4 : GeomV4 {
  __device__ static const uint8_t* src(const uint8_t* blk, int off, int page_shift, int c) {
    // chunks 0..35: the 576 data bytes; chunk 36: the 8 scale bytes (after the block's data).
    return c < 36 ? blk + off * kTok + c * 16 : blk + (kTok << page_shift) + off * 8;
  }
  __device__ static float scale(const uint8_t* rec, int c16) {   // c16: 16-dim chunk of the NoPE part
    const uint32_t e = rec[576 + (c16 >> 2)];                   // UE8M0: 2^(e - 127)
    return __uint_as_float(e << 23);
  }
  // scale * 2^112 as bf16 bits, exact and normal when e <= 142 (fast_scales).
  __device__ static uint32_t scale_bf16_112(const uint8_t* rec, int c16) {
    const uint32_t e = rec[576 + (c16 >> 2)];
    return (e + 112u) << 7;
  }
  // Every scale of the record takes the fast conversion (rec: 8-byte aligned in shared memory).
  __device__ static bool fast_scales(const uint8_t* rec) {
    const uint2 x = *reinterpret_cast<const uint2*>(rec + 576);
    return fast_ue8m0_scales(x.x, x.y);
  }
};

struct LayoutV32 : GeomV32 {
  __device__ static const uint8_t* src(const uint8_t* blk, int off, int, int c) {
    return blk + off * kTok + c * 16;
  }
  __device__ static float scale(const uint8_t* rec, int c16) {
    return *reinterpret_cast<const float*>(rec + 512 + 4 * (c16 >> 3));
  }
  __device__ static uint32_t scale_bf16_112(const uint8_t* rec, int c16) {
    return __float_as_uint(scale(rec, c16) * 0x1p112f) >> 16;   // exact, normal and finite when fast_scales
  }
  __device__ static bool fast_scales(const uint8_t* rec) {   // rec: 16-byte aligned in shared memory
    const uint4 x = *reinterpret_cast<const uint4*>(rec + 512);
    return fast_fp32_scale(x.x) && fast_fp32_scale(x.y) && fast_fp32_scale(x.z) && fast_fp32_scale(x.w);
  }
};

#pragma nv_diag_default 177
struct LayoutV32B : GeomV32B {};

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
// 16 bytes, or 16 zero bytes when src_size = 0 (nothing is read then).
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, int src_size) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_size)
               : "memory");
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
// The global timer (ns, comparable across SMs), for the tuning build's timelines.
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
// Named barrier `id` (0 is __syncthreads) for the n threads (a multiple of 32) that use it.
__device__ __forceinline__ void bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16-byte chunk c of row r in a tile whose rows are a multiple of 128 bytes: XOR the chunk's low 3 bits
// with the row, so the 8 rows an ldmatrix reads at one logical chunk hit 8 different bank groups.
template <int kRowBytes>
__device__ __forceinline__ int swz(int r, int c) {
  static_assert(kRowBytes % 128 == 0, "rows must be whole 128-byte lines");
  return r * kRowBytes + (((c & ~7) | ((c ^ r) & 7)) << 4);
}
// P tile: rows of T bf16 (128 or 64 bytes).
template <int T>
__device__ __forceinline__ int pswz(int r, int c) {
  if constexpr (T == 64) return r * 128 + ((c ^ (r & 7)) << 4);
  else return r * 64 + ((c ^ ((r >> 1) & 3)) << 4);
}

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Two e4m3 (low byte first) times a power-of-two scale, as bf16x2: exact unless the product leaves
// bf16's normal range.
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t two, float sc) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<__half2*>(&h));
  __nv_bfloat162 v = __floats2bfloat162_rn(f.x * sc, f.y * sc);
  return *reinterpret_cast<uint32_t*>(&v);
}

#pragma nv_diag_suppress 177
// Two e4m3 -> bf16x2 times scale, with sc2 = (scale * 2^112) as bf16x2 (exact and normal; see
// scale_bf16_112): cvt to f16x2 (exact), then f16 bits -> bf16 bits by moving the exponent/mantissa field
// down 3 places (value * 2^-112, still a normal bf16), then one bf16x2 multiply. 5 instructions per pair
// instead of 6 (cvt, 2 f16->f32, 2 fmul, pack).
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2_fast(uint32_t two, uint32_t sc2) {
  const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const uint32_t h = static_cast<uint32_t>(hr.x) | (static_cast<uint32_t>(hr.y) << 16);
  const uint32_t z = ((h & 0x7fff7fffu) >> 3) | (h & 0x80008000u);
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&z),
                                   *reinterpret_cast<const __nv_bfloat162*>(&sc2));
  return *reinterpret_cast<const uint32_t*>(&r);
}
#pragma nv_diag_default 177

// 16 e4m3 values (one 16-byte chunk, low byte first) -> 16 bf16, two at a time by pair(two e4m3) -> bf16x2.
template <class Pair>
__device__ __forceinline__ void fp8x16_by_pairs(const uint4 w, const Pair& pair, uint4& lo, uint4& hi) {
  lo.x = pair(w.x & 0xffff);
  lo.y = pair(w.x >> 16);
  lo.z = pair(w.y & 0xffff);
  lo.w = pair(w.y >> 16);
  hi.x = pair(w.z & 0xffff);
  hi.y = pair(w.z >> 16);
  hi.z = pair(w.w & 0xffff);
  hi.w = pair(w.w >> 16);
}

// 16 e4m3 values (one 16-byte chunk) times a power-of-two scale -> 16 bf16, in fp32 (exact unless a product
// leaves bf16's normal range).
__device__ __forceinline__ void fp8x16_to_bf16(const uint4 w, float sc, uint4& lo, uint4& hi) {
  fp8x16_by_pairs(w, [sc](uint32_t two) { return fp8x2_to_bf16x2(two, sc); }, lo, hi);
}

// The epilogue's per-row factors use the SFU's approximations (MUFU.LG2 / RCP / EX2: relative error ~2^-22, far
// below the bf16 output's 2^-9 and the lse's tolerance): the IEEE versions were ~40 instructions each plus a
// division slow path, per head row and warpgroup, in code every call runs once and cold (NOTES.md "Cold code").
// Natural-log lse of a head's row from its log2-domain running maximum m and sum l (-inf: no valid entry).
__device__ __forceinline__ float row_lse(float m, float l) {
  return l > 0.f ? (m + __log2f(l)) * 0.69314718055994531f : -INFINITY;
}
// 1 / l of a row's sum, 0 for a row with no valid entry (l = 0). A row with one is >= 1 (its maximum's term).
__device__ __forceinline__ float inv_sum(float l) { return l > 0.f ? __fdividef(1.f, l) : 0.f; }
// The factor of a head's unnormalized O when the CTA writes the final output (splits == 1): 1 / l times the
// sink's share 1 / (1 + exp(sink - lse)); 0 for a row with no valid entry.
__device__ __forceinline__ float out_factor(const MlaParams& p, int head, float l, float lse) {
  float f = inv_sum(l);
  if (l > 0.f && p.sinks) f = __fdividef(f, 1.f + __expf(p.sinks[head] - lse));
  return f;
}

// How many entries of its row's list (the main indices, then the extra ones) split `split` takes, from position
// split * p.per_split: p.per_split, fewer for the last split, none for a split past the end.
__device__ __forceinline__ int split_entries(const MlaParams& p, int split) {
  const int ntot = p.topk + p.topk_extra;
  const int start = split * p.per_split;
  return max(0, min(p.per_split, ntot - start));
}

// Entry `pos` of a row's index list (the main indices, then the extra ones): where it is, and its value validated
// (-1 when invalid, kExtraBit set for the extra source). Split so that a caller can issue several loads before it
// uses any (a load followed by its check waits for each load's round trip in turn).
// Both are selects, not branches (index_list unrolls them eight times into every kernel's prologue, the first code
// a call runs, cold: NOTES.md "Cold code").
__device__ __forceinline__ const int* index_src(const MlaParams& p, int row, int pos) {
  const bool main = pos < p.topk;
  const long long off = main ? static_cast<long long>(row) * p.topk + pos
                             : static_cast<long long>(row) * p.topk_extra + (pos - p.topk);
  return (main ? p.indices : p.indices_extra) + off;
}
__device__ __forceinline__ int index_check(const MlaParams& p, int pos, int i) {
  const bool main = pos < p.topk;
  const uint32_t n = static_cast<uint32_t>(main ? p.num_entries : p.num_entries_extra);   // i < 0: above n
  return static_cast<uint32_t>(i) < n ? (main ? i : i | kExtraBit) : -1;
}
// *src, or -1 without a load when `in` is false: a predicated load (as a conditional expression it compiled to a
// branch around the address arithmetic and the load, ~20 instructions per index). volatile: kept in order with the
// other volatile asm, e.g. a griddepcontrol.wait before it (a plain asm is no memory access to the compiler).
__device__ __forceinline__ int ldg_index_if(const int* src, bool in) {
  int v;
  asm volatile("{\n.reg .pred q;\nsetp.ne.b32 q, %2, 0;\nmov.b32 %0, -1;\n@q ld.global.nc.b32 %0, [%1];\n}\n"
      : "=r"(v)
      : "l"(src), "r"(static_cast<int>(in)));
  return v;
}
// (Used by the sm_90a wgt kernels only: no "never referenced" warning for the other target.)
#pragma nv_diag_suppress 177
__device__ __forceinline__ int load_index(const MlaParams& p, int row, int pos) {
  return index_check(p, pos, __ldg(index_src(p, row, pos)));
}
#pragma nv_diag_default 177

// This CTA's part of the row's index list, validated once: positions start .. start + n_local - 1
// (the main indices, then the extra ones), -1 for invalid entries and for the padding up to n_fill,
// kExtraBit set for the extra source. A thread issues up to kBatch loads before it checks or stores any, so a
// list of up to kBatch x NTHR entries costs one DRAM round trip (a load-store loop waited once per trip).
// `after_loads` runs once, right after the first batch's loads are issued and before any is waited for (with no
// index to load, at the end): a caller's other requests (the first-version kernels' Q block) then go out behind the
// indices instead of ahead of them.
struct NoRequests {
  __device__ __forceinline__ void operator()() const {}
};
template <int NTHR, class AfterLoads = NoRequests>
__device__ __forceinline__ void index_list(const MlaParams& p, int row, int start, int n_local, int n_fill, int tid,
                                           int* sidx, const AfterLoads& after_loads = AfterLoads()) {
  constexpr int kBatch = 8;
  const int* const main_row = p.indices + static_cast<size_t>(row) * p.topk;   // as index_src, row bases hoisted
  const int* const extra_row = p.indices_extra + static_cast<size_t>(row) * p.topk_extra;
  for (int j0 = 0; j0 < n_fill; j0 += kBatch * NTHR) {
    int v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int j = j0 + b * NTHR + tid, pos = start + j;
      const bool main = pos < p.topk;
      v[b] = ldg_index_if((main ? main_row : extra_row) + (main ? pos : pos - p.topk), j < n_local);
    }
    if (j0 == 0) after_loads();
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int j = j0 + b * NTHR + tid;
      if (j < n_fill) sidx[j] = index_check(p, start + j, v[b]);   // -1 past n_local
    }
  }
  if (n_fill <= 0) after_loads();
}

// Requests the Q block of `rows` heads from head h0 (heads at or past p.h zero-filled) into shared memory by
// cp.async, 16 bytes each, at dst(r, c) for row r and 16-byte chunk c. No request waits for another, so the block
// costs one DRAM round trip (a load-store loop, unrolled four times, waited for every fourth chunk: three to four
// round trips before the first tile). The caller waits (cp.async.wait_group) before reading it.
template <int DQK, class Dst>
__device__ __forceinline__ void q_block_async(const MlaParams& p, int row, int h0, int rows, int tid, int nthr,
                                              const Dst& dst) {
  constexpr int CH = DQK / 8;
  const __nv_bfloat16* q = p.q + static_cast<size_t>(row) * p.h * DQK;
  for (int i = tid; i < rows * CH; i += nthr) {
    const int r = i / CH, c = i - r * CH;
    const bool ok = h0 + r < p.h;
    cp_async16_zfill(dst(r, c), ok ? q + static_cast<size_t>(h0 + r) * DQK + 8 * c : p.q, ok ? 16 : 0);
  }
}

// log2 of the page of a validated index's source: each source has its own (V4's window cache pages 256 entries per
// block, its compressed caches 64 (C4) or 2 (C128), and SGLang hands both to one call).
__device__ __forceinline__ int entry_page_shift(const MlaParams& p, int v) {
  return (v & kExtraBit) ? p.page_shift_extra : p.page_shift;
}
// The entry's position within its block (kExtraBit lies above every page mask).
__device__ __forceinline__ int entry_offset(const MlaParams& p, int v) {
  return v & ((1 << entry_page_shift(p, v)) - 1);
}
// Base of the cache block holding a validated index (>= 0; kExtraBit: the extra source).
__device__ __forceinline__ const uint8_t* entry_block(const MlaParams& p, int v) {
  const bool extra = v & kExtraBit;
  const int idx = v & (kExtraBit - 1);
  return (extra ? p.kv_extra : p.kv) +
         static_cast<long long>(idx >> entry_page_shift(p, v)) * (extra ? p.block_stride_extra : p.block_stride);
}

// Dequantize one fp8 tile: raw records -> bf16 [T x d_qk] (swizzled); rows of invalid or past-the-end
// entries zeroed. (The wg kernels' fast conversion here measured no faster at one row, where this phase is a sixth of
// a split CTA's time: it is not bound by its conversion instructions; NOTES.md "One row: where a split CTA's time
// goes".)
template <class L, int T, int NTHR, int ROWB>
__device__ __forceinline__ void dequant(const uint8_t* rb, uint8_t* tile, const int* sidx, int j0, int n_local,
                                        int tid) {
  constexpr int NCH = L::kNope / 16;   // 16-dim fp8 chunks per entry
  for (int i = tid; i < T * NCH; i += NTHR) {
    const int e = i / NCH, c = i - e * NCH;
    const int j = j0 + e;
    uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
    if (j < n_local && sidx[j] >= 0) {
      const uint8_t* rec = rb + e * L::kRec;
      const uint4 w = *reinterpret_cast<const uint4*>(rec + c * 16);
      const float sc = L::scale(rec, c);
      fp8x16_to_bf16(w, sc, lo, hi);
    }
    *reinterpret_cast<uint4*>(tile + swz<ROWB>(e, 2 * c)) = lo;
    *reinterpret_cast<uint4*>(tile + swz<ROWB>(e, 2 * c + 1)) = hi;
  }
  for (int i = tid; i < T * 8; i += NTHR) {
    const int e = i >> 3, c = i & 7;
    const int j = j0 + e;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (j < n_local && sidx[j] >= 0) v = *reinterpret_cast<const uint4*>(rb + e * L::kRec + L::kRopeRaw + c * 16);
    *reinterpret_cast<uint4*>(tile + swz<ROWB>(e, L::kRopeChunk + c)) = v;
  }
}
}  // namespace
