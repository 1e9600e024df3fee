// Sparse MLA decode (DeepSeek-V4-Flash and V3.2) on warp-level mma.sync (bf16 m16n8k16), sm_90a / sm_120a.
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
//
// Work split: grid (splits, head blocks, rows). A CTA owns 16*MT heads of one row and a contiguous range
// of that row's entries. Per tile of T entries:
//   1. cp.async gathers the raw entries (NST-stage ring, each entry a contiguous smem record);
//   2. all threads dequantize the tile once into a bf16 [T x d_qk] smem tile (exact: e4m3 * 2^k fits
//      bf16), zero rows for invalid entries so that 0 * garbage never reaches the accumulators;
//   3. QK: warp (mt, grp) computes S for heads [16 mt, 16 mt + 16) x entries [grp * T/G, ...) with Q and
//      K from smem through ldmatrix;
//   4. online softmax in the log2 domain, row maxima and sums exchanged through smem, P (bf16) to smem;
//   5. PV: warp (mt, grp) accumulates O for the same 16 heads x dims [grp * 512/G, ...) (ldmatrix.trans on
//      the same bf16 tile: K and V are one entry).
// With splits == 1 the CTA writes bf16 o and lse; otherwise it writes its normalized fp32 partial o and
// partial lse, and sparse_mla_combine merges the splits and applies the sink.
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <type_traits>

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
struct LayoutV4B : GeomV4B {};
struct LayoutV32B : GeomV32B {};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Programmatic dependent launch (sm_90+; no-ops without the launch attribute and before sm_90): a main
// kernel lets the split combine be scheduled from its start (the combine's launch and prologue then overlap
// the main kernel instead of following it), and the combine waits until the main kernel's memory is visible.
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
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
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
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

// OPT bit 0: per-warp gather (one entry per warp iteration, its index and source addresses computed once,
// lanes = chunks); 0: the gather loops over (entry, chunk) items, index decoded per item. The fp8 kernels use
// 0, the bf16 ones 1 (the per-warp gather with a per-warp fp8 dequant and its halves "_og" / "_od" were measured no
// faster and removed, NOTES.md "Sparse MLA decode"; the per-warp fp8 gather alone, the tuning build's "_o1", measured
// no faster at one row either, NOTES.md "One row, and the heads between 16 and 64").
// OPT bit 1 (kMlaQkSplit: KS = 2, the "_w16" kernels, tuning build only): twice the warps, each pair of warps sharing a
// (head tile, entry group) splits d_qk in QK (partial S exchanged through shared memory at a barrier of the pair) and
// the CTA's warps split the output dims 16 ways in PV, halving each warp's share of the gather, dequantization, QK
// and PV; measured no faster at one row (NOTES.md "One row: where a split CTA's time goes"). OPT bit 2 (tuning
// build): a timeline (MlaTlSlot).
template <class L, int MT, int T, int G, int NST, int OPT>
__device__ __forceinline__ void mla_body(const MlaParams& p, uint8_t* smem) {
  constexpr int KS = kMlaQkSplit<OPT>;   // warps per (head tile, entry group)
  constexpr bool TL = OPT & 4;
  constexpr int HB = 16 * MT;           // heads per CTA
  constexpr int NW = MT * G * KS;       // warps
  constexpr int NTHR = NW * 32;
  constexpr int EPW = T / G;            // entries per warp in QK
  constexpr int NTQ = EPW / 8;          // QK n-tiles per warp
  constexpr int DPW = kDv / (G * KS);   // output dims per warp in PV
  constexpr int NTV = DPW / 8;          // PV n-tiles per warp
  constexpr int KSTEPS = L::kDqk / 16 / KS;   // QK k-steps per warp
  static_assert(KSTEPS % 2 == 0, "k-steps come in pairs");
  static_assert(KS == 1 || (KS == 2 && MT * G <= 15 && (MT * G & (MT * G - 1)) == 0),
                "a warp pair: one named barrier each (ids 1-15), partner = warp ^ (MT * G)");
  constexpr int ROWB = L::kDqk * 2;     // bf16 tile row bytes
  constexpr bool BF = L::kBf16;
  static_assert(NTQ == 1 || NTQ == 2, "a QK warp covers 8 or 16 entries");
  static_assert(NTV % 2 == 0 && T % 16 == 0, "tile shape");
  using S = MlaSmem<L, MT, T, G, NST, KS>;   // fp8: NST raw-record stages + one bf16 tile; bf16: NST tile stages
  constexpr int RAWB = S::kRawB;        // bytes per ring stage
  static_assert(S::kRowB == ROWB && S::kThreads == NTHR, "MlaSmem describes this kernel");

  uint8_t* raw = smem + S::kRaw;
  uint8_t* tile = smem + S::kTile;
  uint8_t* qs = smem + S::kQ;
  uint8_t* ps = smem + S::kP;
  float* red_max = reinterpret_cast<float*>(smem + S::kRedMax);
  float* red_sum = reinterpret_cast<float*>(smem + S::kRedSum);
  int* sidx = reinterpret_cast<int*>(smem + S::kSidx);

  const int split = blockIdx.x, hblk = blockIdx.y, row = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // kq: which half of d_qk (QK) this warp takes when KS = 2 (written so that KS = 1 compiles as before)
  const int mt = warp % MT, grp = KS == 1 ? warp / MT : (warp / MT) % G, kq = KS == 1 ? 0 : warp / (MT * G);
  const int ntot = p.topk + p.topk_extra;
  const int start = split * p.per_split;
  const int n_local = max(0, min(p.per_split, ntot - start));
  const int ntiles = (n_local + T - 1) / T;
  unsigned long long* tl = TL ? reinterpret_cast<unsigned long long*>(p.counters) +
                                    kMlaTl * (split + gridDim.x * (hblk + gridDim.y * row))
                              : nullptr;
  auto stamp = [&](int slot) {
    if constexpr (TL) {
      if (tid == 0)
        tl[slot] = slot == kMlaTlEntryNs || slot == kMlaTlExitNs ? globaltimer_ns() : clock64();
    }
  };
  stamp(kMlaTlEntryNs);
  stamp(kMlaTlEntry);

  // This CTA's indices, validated once: -1 for invalid, kExtraBit set for the extra source. The Q block (rows past h
  // are zero) is requested right behind the indices' loads: it joins the first ring stage's cp.async group, so the
  // wait for tile 0 covers it, and its round trip overlaps the index list's and tile 0's. (Requested ahead of them,
  // as until 2026-12-03, its 16-18 KB went out before the indices the gather waits for: NOTES.md "Requests that
  // queued behind others".)
  index_list<NTHR>(p, row, start, n_local, n_local, tid, sidx, [&]() {
    q_block_async<L::kDqk>(p, row, hblk * HB, HB, tid, NTHR, [&](int r, int c) { return qs + swz<ROWB>(r, c); });
  });
  __syncthreads();
  stamp(kMlaTlIndices);

  // OPT 0 (fp8): one (entry, chunk) item per thread iteration.
  auto issue_items = [&](int ti) {
    if (ti < ntiles) {
      uint8_t* dst0 = raw + (ti % NST) * RAWB;
      for (int i = tid; i < T * L::kChunks; i += NTHR) {
        const int e = i / L::kChunks, c = i - e * L::kChunks;
        const int j = ti * T + e;
        if (j >= n_local) continue;
        const int v = sidx[j];
        if (v < 0) continue;
        if constexpr (!BF) {
          const uint8_t* s = L::src(entry_block(p, v), entry_offset(p, v), entry_page_shift(p, v), c);
          uint8_t* d = dst0 + e * L::kRec + c * 16;
          if (L::kChunks == 37 && c == 36) cp_async8(d, s);
          else cp_async16(d, s);
        }
      }
    }
    cp_async_commit();
  };
  // Per-warp gather: warp w takes entries w, w + NW, ...; the entry's addresses are computed once (the
  // index is uniform across the warp) and the lanes copy its 16-byte chunks. bf16: straight into the
  // swizzled tile, invalid or past-the-end entries zero-filled (so 0 x garbage never reaches PV).
  auto issue_warp = [&](int ti) {
    if (ti < ntiles) {
      uint8_t* dst0 = raw + (ti % NST) * RAWB;
      for (int e = warp; e < T; e += NW) {
        const int j = ti * T + e;
        const int v = j < n_local ? sidx[j] : -1;
        if constexpr (BF) {
          const uint8_t* src = p.kv;
          int sz = 0;
          if (v >= 0) {
            src = entry_block(p, v) + static_cast<long long>(entry_offset(p, v)) * L::kTok;
            sz = 16;
          }
#pragma unroll
          for (int c = lane; c < L::kChunks; c += 32)
            cp_async16_zfill(dst0 + swz<ROWB>(e, c), src + (sz ? c * 16 : 0), sz);
        } else {
          if (v < 0) continue;
          const uint8_t* blk = entry_block(p, v);
          const int off = entry_offset(p, v);
          uint8_t* d = dst0 + e * L::kRec;
#pragma unroll
          for (int c = lane; c < L::kChunks; c += 32) {
            const uint8_t* s = L::src(blk, off, entry_page_shift(p, v), c);
            if (L::kChunks == 37 && c == 36) cp_async8(d + c * 16, s);
            else cp_async16(d + c * 16, s);
          }
        }
      }
    }
    cp_async_commit();
  };
  auto issue = [&](int ti) {
    if constexpr (BF || (OPT & 1)) issue_warp(ti);
    else issue_items(ti);
  };

  for (int s = 0; s < NST - 1; ++s) issue(s);
  stamp(kMlaTlIssued);

  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float oacc[NTV][4];
#pragma unroll
  for (int n = 0; n < NTV; ++n) oacc[n][0] = oacc[n][1] = oacc[n][2] = oacc[n][3] = 0.f;

  const int e0 = grp * EPW;
  const int d0 = (kq * G + grp) * DPW;
  const int qrow = mt * 16 + g;   // this thread's first head row within the block (second: +8)

  for (int it = 0; it < ntiles; ++it) {
    const uint8_t* kt;   // this tile's bf16 [T x d_qk] (swizzled)
    if constexpr (BF) {
      cp_async_wait<NST - 2>();
      __syncthreads();   // S0: tile `it` landed; every warp is done with tile it-1 (its ring slot is reused next)
      issue(it + NST - 1);
      kt = raw + (it % NST) * RAWB;
      if (it == 0) {
        stamp(kMlaTlLanded);
        stamp(kMlaTlConverted);
      }
    } else {
      issue(it + NST - 1);   // into the buffer tile it-1 used; every thread passed its dequant (S1)
      cp_async_wait<NST - 1>();
      __syncthreads();   // S0: tile `it` landed; the previous PV is done with the bf16 tile
      kt = tile;
      if (it == 0) stamp(kMlaTlLanded);
      dequant<L, T, NTHR, ROWB>(raw + (it % NST) * RAWB, tile, sidx, it * T, n_local, tid);
      __syncthreads();   // S1: bf16 tile complete; raw buffer free
      if (it == 0) stamp(kMlaTlConverted);
    }

    // S = Q K^T for 16 heads x EPW entries, in 4 independent accumulator chains (a single chain of
    // 32-36 dependent HMMAs per warp was the QK phase's latency).
    float s4[4][NTQ][4];
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int n = 0; n < NTQ; ++n) s4[c][n][0] = s4[c][n][1] = s4[c][n][2] = s4[c][n][3] = 0.f;
    // One step: k-steps ks, ks + 1 into chains c, c + 1.
    auto qk_step = [&](int ks, int c) {
      uint32_t a0[4], a1[4];
      ldsm_x4(a0, qs + swz<ROWB>(mt * 16 + (lane & 15), 2 * ks + (lane >> 4)));
      ldsm_x4(a1, qs + swz<ROWB>(mt * 16 + (lane & 15), 2 * ks + 2 + (lane >> 4)));
      if constexpr (NTQ == 1) {
        uint32_t b[4];
        ldsm_x4(b, kt + swz<ROWB>(e0 + (lane & 7), 2 * ks + (lane >> 3)));
        mma_bf16(s4[c][0], a0, b[0], b[1]);
        mma_bf16(s4[c + 1][0], a1, b[2], b[3]);
      } else {
        uint32_t b0[4], b1[4];
        ldsm_x4(b0, kt + swz<ROWB>(e0 + (lane & 7) + ((lane >> 4) << 3), 2 * ks + ((lane >> 3) & 1)));
        ldsm_x4(b1, kt + swz<ROWB>(e0 + (lane & 7) + ((lane >> 4) << 3), 2 * ks + 2 + ((lane >> 3) & 1)));
        mma_bf16(s4[c][0], a0, b0[0], b0[1]);
        mma_bf16(s4[c][1], a0, b0[2], b0[3]);
        mma_bf16(s4[c + 1][0], a1, b1[0], b1[1]);
        mma_bf16(s4[c + 1][1], a1, b1[2], b1[3]);
      }
    };
    if constexpr (KS == 1) {
      static_assert(KSTEPS % 4 == 0, "k-steps come in fours");
#pragma unroll 1
      for (int ks = 0; ks < KSTEPS; ks += 4) {
        qk_step(ks, 0);
        qk_step(ks + 2, 2);
      }
    } else {   // this warp's half of d_qk (V3.2: 18 k-steps, the last pair alone)
      const int k0 = kq * KSTEPS;
#pragma unroll 1
      for (int ks = 0; ks + 4 <= KSTEPS; ks += 4) {
        qk_step(k0 + ks, 0);
        qk_step(k0 + ks + 2, 2);
      }
      if constexpr (KSTEPS % 4 == 2) qk_step(k0 + KSTEPS - 2, 0);
    }
    float s[NTQ][4];
#pragma unroll
    for (int n = 0; n < NTQ; ++n)
#pragma unroll
      for (int q = 0; q < 4; ++q) s[n][q] = (s4[0][n][q] + s4[1][n][q]) + (s4[2][n][q] + s4[3][n][q]);
    if (it == 0) stamp(kMlaTlQk);
    if constexpr (KS == 2) {
      // The pair (kq = 0, 1) publish their partial S, meet at their own barrier, and each adds the other's:
      // fp32 addition commutes, so both hold the same S. The buffer's previous readers passed S2 of tile it-1.
      float* sx = reinterpret_cast<float*>(smem + S::kSx);
#pragma unroll
      for (int n = 0; n < NTQ; ++n)
#pragma unroll
        for (int q = 0; q < 4; ++q) sx[((warp * NTQ + n) * 4 + q) * 32 + lane] = s[n][q];
      bar_sync(1 + warp % (MT * G), 64);
      const int peer = warp ^ (MT * G);   // MT * G is a power of two
#pragma unroll
      for (int n = 0; n < NTQ; ++n)
#pragma unroll
        for (int q = 0; q < 4; ++q) s[n][q] += sx[((peer * NTQ + n) * 4 + q) * 32 + lane];
    }

    // Scale, mask, row maxima.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < NTQ; ++n) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int j = it * T + e0 + n * 8 + 2 * t + (q & 1);
        const bool ok = j < n_local && sidx[j] >= 0;
        s[n][q] = ok ? s[n][q] * p.scale_log2 : -INFINITY;
        mx[q >> 1] = fmaxf(mx[q >> 1], s[n][q]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    }
    if (t == 0 && kq == 0) {
      red_max[grp * HB + qrow] = mx[0];
      red_max[grp * HB + qrow + 8] = mx[1];
    }
    __syncthreads();   // S2
    if (it == 0) stamp(kMlaTlMax);

    float m_new[2], m_use[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = m_run[r];
#pragma unroll
      for (int k = 0; k < G; ++k) m = fmaxf(m, red_max[k * HB + qrow + 8 * r]);
      m_new[r] = m;
      m_use[r] = (m == -INFINITY) ? 0.f : m;   // an all-invalid prefix: exp2(-inf - 0) = 0, never NaN
    }
#pragma unroll
    for (int n = 0; n < NTQ; ++n) {
      if (kq != 0) break;   // the pair's other warp writes P and the sums
      const float p0 = exp2f(s[n][0] - m_use[0]), p1 = exp2f(s[n][1] - m_use[0]);
      const float p2 = exp2f(s[n][2] - m_use[1]), p3 = exp2f(s[n][3] - m_use[1]);
      sum[0] += p0 + p1;
      sum[1] += p2 + p3;
      const int col = e0 + n * 8 + 2 * t;
      *reinterpret_cast<uint32_t*>(ps + pswz<T>(qrow, col >> 3) + (col & 7) * 2) = pack_bf16(p0, p1);
      *reinterpret_cast<uint32_t*>(ps + pswz<T>(qrow + 8, col >> 3) + (col & 7) * 2) = pack_bf16(p2, p3);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    }
    if (t == 0 && kq == 0) {
      red_sum[grp * HB + qrow] = sum[0];
      red_sum[grp * HB + qrow + 8] = sum[1];
    }
    __syncthreads();   // S3: P and the partial sums are complete
    if (it == 0) stamp(kMlaTlSoftmax);

    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      alpha[r] = exp2f(m_run[r] - m_use[r]);
      float l = 0.f;
#pragma unroll
      for (int k = 0; k < G; ++k) l += red_sum[k * HB + qrow + 8 * r];
      l_run[r] = l_run[r] * alpha[r] + l;
      m_run[r] = m_new[r];
    }
#pragma unroll
    for (int n = 0; n < NTV; ++n) {
      oacc[n][0] *= alpha[0];
      oacc[n][1] *= alpha[0];
      oacc[n][2] *= alpha[1];
      oacc[n][3] *= alpha[1];
    }
    // O += P V for 16 heads x DPW dims.
#pragma unroll
    for (int kk = 0; kk < T / 16; ++kk) {
      uint32_t a[4];
      ldsm_x4(a, ps + pswz<T>(mt * 16 + (lane & 15), 2 * kk + (lane >> 4)));
#pragma unroll
      for (int jn = 0; jn < NTV / 2; ++jn) {
        uint32_t b[4];
        ldsm_x4_t(b, kt + swz<ROWB>(16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3), d0 / 8 + 2 * jn + (lane >> 4)));
        mma_bf16(oacc[2 * jn], a, b[0], b[1]);
        mma_bf16(oacc[2 * jn + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait<0>();
  stamp(kMlaTlPv);

  // Epilogue: this thread holds heads qrow, qrow + 8 at dims d0 + 8n + 2t, +1.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int head = hblk * HB + qrow + 8 * r;
    if (head >= p.h) continue;
    const float l = l_run[r];
    const float lse = row_lse(m_run[r], l);
    if (p.splits == 1) {
      const float f = out_factor(p, head, l, lse);
      __nv_bfloat16* o = p.out + (static_cast<size_t>(row) * p.h + head) * kDv + d0 + 2 * t;
#pragma unroll
      for (int n = 0; n < NTV; ++n)
        *reinterpret_cast<uint32_t*>(o + 8 * n) = pack_bf16(oacc[n][2 * r] * f, oacc[n][2 * r + 1] * f);
      if (grp == 0 && kq == 0 && t == 0) p.lse[static_cast<size_t>(row) * p.h + head] = l > 0.f ? lse : INFINITY;
    } else {
      const float f = inv_sum(l);
      const size_t base = (static_cast<size_t>(row) * p.splits + split) * p.h + head;
      float* o = p.o_part + base * kDv + d0 + 2 * t;
#pragma unroll
      for (int n = 0; n < NTV; ++n)
        *reinterpret_cast<float2*>(o + 8 * n) = make_float2(oacc[n][2 * r] * f, oacc[n][2 * r + 1] * f);
      if (grp == 0 && kq == 0 && t == 0) p.lse_part[base] = lse;
    }
  }
  stamp(kMlaTlEnd);
  stamp(kMlaTlExitNs);
}


// ---- "ds" kernels (fp8 layouts): warps split the head dimension, dequantization inside the MMA operands ----
//
// Why: the kernels above spend most of a tile in one block-wide pass that dequantizes e4m3 through fp32
// into a bf16 tile (fp32 -> bf16 conversion runs at 16 results per clock per SM on Hopper), with every
// phase separated by block barriers, and every warp re-reads all of Q from shared memory. Here:
//   * one lane per entry issues a bulk copy (cp.async.bulk) of the whole record into an NST-stage ring,
//     completing on an mbarrier (V4: 576 data bytes + the 16-byte aligned scale pair holding its record);
//     each warp issues T/8 entries; invalid and past-the-end entries are zero-filled by that warp instead;
//   * warp w owns 64 dims of the entry (V4: scale group w, warp 7 the bf16 RoPE dims; V3.2: fp8 dims
//     64w..64w+63, and the RoPE dims of entries 8w..8w+7). QK: the warp converts its own e4m3 bytes of
//     every entry straight into f16 MMA operands (cvt.rn.f16x2.e4m3x2, exact; the dims are permuted so one
//     16-byte load feeds 4 k-steps, Q permuted the same way and held in registers as f16, rescaled per
//     head by a power of two so its maximum is in [2^14, 2^15)); the per-entry scale multiplies the fp32
//     partial afterwards (exact for any scale). The partial S of each warp goes to shared memory;
//   * owner warps (2*MT heads each) sum the partials of their heads over all T entries, so the maximum,
//     P and the running sum need no exchange between warps; P goes to shared memory as f16 (and bf16 for
//     V4's RoPE warp) with the rescale factor alpha;
//   * PV: warp w accumulates its 64 output dims; V comes from the same raw bytes (byte-transposed with
//     PRMT, cvt to f16, times the entry's scale in f16), the output dims permuted so that a thread ends
//     with 16 consecutive dims per head row.
// Two block barriers per tile (partials complete; P complete) plus the mbarrier wait.
// Range (CV = 0): PV multiplies V by its scale in f16, so |dequantized V| must stay below 65504 (always so
// for scales up to 2^7, e4m3's maximum being 448) and scales below 2^-24 flush to zero; the _c4 kernels
// have no such limit. QK has none either (fp32 scaling, Q rescaled per head).
// Measured on H200 (NOTES.md): 1.05-1.7x faster than the kernels above at B >= 64 (V3.2 h=16: 1.7x), not
// faster at B <= 8 for V4, slower for V4 with h >= 64 at large batch (each 32-head block gathers and converts
// the entries again). The per-tile time is still far above the tile's bytes: latency-bound with 8 warps/SM.

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "DS_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DS_DONE;\n"
      "bra DS_WAIT;\n"
      "DS_DONE:\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
// Four e4m3 (low byte first) -> two f16x2 (bytes 0-1 -> lo, 2-3 -> hi); exact.
__device__ __forceinline__ void cvt_e4m3x4(uint32_t x, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(x));
}
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_f16(float a, float b) {
  __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}
// Power-of-two exponent k that puts a row's max |q| (fp32 bits, >= 0) into [2^14, 2^15) for f16.
__device__ __forceinline__ int q_shift(uint32_t mbits) {
  const int e = static_cast<int>((mbits >> 23) & 0xffu);
  if (mbits == 0u || e == 0xff) return 0;   // all-zero row (or inf/NaN: nothing to save)
  return min(126, max(-126, 14 - (e - 127)));
}
__device__ __forceinline__ float exp2i(int k) { return __uint_as_float(static_cast<uint32_t>(127 + k) << 23); }

// Fills ring slot ti % NST of a ds or es kernel (8 warps) with tile ti: every warp issues its T/8 entries, one
// lane per entry (the bulk copy takes uniform operands, so the compiler serializes the lanes' copies: spreading
// them over all warps keeps that loop short), and arrives on the slot's barrier with its byte count.
template <class L, int T, int NST>
__device__ __forceinline__ void ds_issue(const MlaParams& p, uint8_t* raw, uint64_t* full, const int* sidx, int ti,
                                         int ntiles, int warp, int lane) {
  constexpr int EPI = T / (kDsThreads / 32), REC = L::kRec;
  constexpr bool V4 = L::kDqk == 512;
  if (ti >= ntiles) return;
  const int slot = ti % NST;
  uint8_t* dst0 = raw + slot * (T * REC) + warp * EPI * REC;
  uint64_t* bar = full + slot;
  const int v = lane < EPI ? sidx[ti * T + warp * EPI + lane] : -1;
  const uint32_t bytes = __reduce_add_sync(0xffffffffu, v >= 0 ? static_cast<uint32_t>(REC) : 0u);
  if (lane == 0) mbar_arrive_expect_tx(bar, bytes);   // before any of this warp's copies can complete
  __syncwarp();
  if (v >= 0) {
    uint8_t* d = dst0 + lane * REC;
    const uint8_t* blk = entry_block(p, v);
    const long long off = entry_offset(p, v);
    if constexpr (V4) {
      bulk_g2s(d, blk + off * 576, 576, bar);
      // The 8-byte scale record sits in the 16-byte aligned pair starting at (off & ~1) * 8.
      bulk_g2s(d + 576, blk + (576ll << entry_page_shift(p, v)) + (off >> 1) * 16, 16, bar);
    } else {
      bulk_g2s(d, blk + off * 656, 656, bar);
    }
  }
  // Invalid and past-the-end entries: zeros, so that 0 x garbage never reaches an accumulator. One ballot finds
  // them (a shuffle per entry cost a dependent round trip each: ncu, NOTES.md "es kernels").
  uint32_t empty = __ballot_sync(0xffffffffu, lane < EPI && v < 0);
  if (empty == 0u) return;
  for (; empty != 0u; empty &= empty - 1u) {
    uint4* d = reinterpret_cast<uint4*>(dst0 + (__ffs(empty) - 1) * REC);
    for (int c = lane; c < REC / 16; c += 32) d[c] = make_uint4(0, 0, 0, 0);
  }
  // Order these generic-proxy stores before later bulk copies (async proxy) into the same slot.
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// One PV k-step (16 entries of the tile in ring record rt) of a ds or es fp8 warp: O[16 mt + .., sbase + ..] +=
// P V for this warp's 64 output dims, V converted from the raw e4m3 bytes and scaled in f16 (CV & 4: the scales
// s01 / s89 of entries 2t, 2t+1 / 2t+8, 2t+9 go into P instead). n-tile j, column n <-> dim sbase + 8 n + j: a
// thread's 8 bytes at dims 8g .. 8g+7 feed all 8 n-tiles. a: P as the MMA's A fragments (f16).
template <class L, int MT, int CV>
__device__ __forceinline__ void ds_pv_fp8(float (&o)[MT][8][4], uint32_t (&a)[MT][4], const uint8_t* rt, int kk,
                                          int sbase, int g, int t, uint32_t s01, uint32_t s89) {
  constexpr int REC = L::kRec;
  const uint8_t* vb = rt + (16 * kk + 2 * t) * REC + sbase + 8 * g;
  const uint2 x0 = *reinterpret_cast<const uint2*>(vb);
  const uint2 x1 = *reinterpret_cast<const uint2*>(vb + REC);
  const uint2 x8 = *reinterpret_cast<const uint2*>(vb + 8 * REC);
  const uint2 x9 = *reinterpret_cast<const uint2*>(vb + 9 * REC);
  if constexpr (CV & 4) {
    // The scales go into P (k = entries): a0/a1 hold entries 2t, 2t+1, a2/a3 entries 2t+8, 2t+9.
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      a[mt][0] = hmul2(a[mt][0], s01);
      a[mt][1] = hmul2(a[mt][1], s01);
      a[mt][2] = hmul2(a[mt][2], s89);
      a[mt][3] = hmul2(a[mt][3], s89);
    }
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t w0 = q < 2 ? x0.x : x0.y, w1 = q < 2 ? x1.x : x1.y;
    const uint32_t w8 = q < 2 ? x8.x : x8.y, w9 = q < 2 ? x9.x : x9.y;
    uint32_t b0l, b0h, b1l, b1h;
    const uint32_t sel = (q & 1) ? 0x7362u : 0x5140u;   // bytes (2q', 2q'+1) of each entry, interleaved
    cvt_e4m3x4(prmt(w0, w1, sel), b0l, b0h);
    cvt_e4m3x4(prmt(w8, w9, sel), b1l, b1h);
    if constexpr (!(CV & 4)) {
      b0l = hmul2(b0l, s01);
      b0h = hmul2(b0h, s01);
      b1l = hmul2(b1l, s89);
      b1h = hmul2(b1h, s89);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      mma_f16(o[mt][2 * q], a[mt], b0l, b1l);
      mma_f16(o[mt][2 * q + 1], a[mt], b0h, b1h);
    }
  }
}

// One PV k-step of the V4 RoPE warp: dims 448..511 (bf16 in the record), natural order, P (a) in bf16.
template <class L, int MT>
__device__ __forceinline__ void ds_pv_rope(float (&o)[MT][8][4], const uint32_t (&a)[MT][4], const uint8_t* rt, int kk,
                                           int lane) {
  constexpr int REC = L::kRec, ROPE = 448;
#pragma unroll
  for (int jn = 0; jn < 4; ++jn) {
    uint32_t b[4];
    ldsm_x4_t(b, rt + (16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3)) * REC + ROPE + (2 * jn + (lane >> 4)) * 16);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      mma_bf16(o[mt][2 * jn], a[mt], b[0], b[1]);
      mma_bf16(o[mt][2 * jn + 1], a[mt], b[2], b[3]);
    }
  }
}

// Epilogue of a ds or es kernel: every warp writes its 64 dims (the V4 RoPE warp dims 448..511) of its heads, the
// final bf16 o and lse (splits == 1) or the fp32 partial and partial lse. ml(mt, hf, r): (m, l) of head row r =
// 16 mt + g + 8 hf, log2-domain running maximum and sum.
template <int MT, int CV, class ML>
__device__ __forceinline__ void ds_write_out(const MlaParams& p, const float (&o)[MT][8][4], const ML& ml,
                                             float ref_run, bool rope_warp, int row, int split, int hblk, int warp,
                                             int g, int t) {
  constexpr int HB = 16 * MT;
  const int sbase = warp * 64;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = 16 * mt + g + 8 * hf;
      const int head = hblk * HB + r;
      if (head >= p.h) continue;
      const float2 ml_r = ml(mt, hf, r);
      const float l = ml_r.y;
      const float lse = row_lse(ml_r.x, l);
      float f;
      if (p.splits == 1) {
        f = out_factor(p, head, l, lse);
      } else {
        f = inv_sum(l);
      }
      if ((CV & 4) && !rope_warp) f *= ref_run;
      const size_t obase = (static_cast<size_t>(row) * p.splits + split) * p.h + head;   // o_part row
      if (!rope_warp) {
        // dims sbase + 16 t + j <- o[mt][j][2 hf]; sbase + 16 t + 8 + j <- o[mt][j][2 hf + 1]
        if (p.splits == 1) {
          __nv_bfloat16* dst = p.out + (static_cast<size_t>(row) * p.h + head) * kDv + sbase + 16 * t;
          uint4 v0, v1;
          v0.x = pack_bf16(o[mt][0][2 * hf] * f, o[mt][1][2 * hf] * f);
          v0.y = pack_bf16(o[mt][2][2 * hf] * f, o[mt][3][2 * hf] * f);
          v0.z = pack_bf16(o[mt][4][2 * hf] * f, o[mt][5][2 * hf] * f);
          v0.w = pack_bf16(o[mt][6][2 * hf] * f, o[mt][7][2 * hf] * f);
          v1.x = pack_bf16(o[mt][0][2 * hf + 1] * f, o[mt][1][2 * hf + 1] * f);
          v1.y = pack_bf16(o[mt][2][2 * hf + 1] * f, o[mt][3][2 * hf + 1] * f);
          v1.z = pack_bf16(o[mt][4][2 * hf + 1] * f, o[mt][5][2 * hf + 1] * f);
          v1.w = pack_bf16(o[mt][6][2 * hf + 1] * f, o[mt][7][2 * hf + 1] * f);
          reinterpret_cast<uint4*>(dst)[0] = v0;
          reinterpret_cast<uint4*>(dst)[1] = v1;
        } else {
          float4* dst = reinterpret_cast<float4*>(p.o_part + obase * kDv + sbase + 16 * t);
#pragma unroll
          for (int c = 0; c < 2; ++c)
#pragma unroll
            for (int hq = 0; hq < 2; ++hq)
              dst[2 * c + hq] = make_float4(o[mt][4 * hq][2 * hf + c] * f, o[mt][4 * hq + 1][2 * hf + c] * f,
                                            o[mt][4 * hq + 2][2 * hf + c] * f, o[mt][4 * hq + 3][2 * hf + c] * f);
        }
      } else {
        // dims 448 + 8 n + 2 t, + 1
        if (p.splits == 1) {
          __nv_bfloat16* dst = p.out + (static_cast<size_t>(row) * p.h + head) * kDv + 448 + 2 * t;
#pragma unroll
          for (int n = 0; n < 8; ++n)
            *reinterpret_cast<uint32_t*>(dst + 8 * n) = pack_bf16(o[mt][n][2 * hf] * f, o[mt][n][2 * hf + 1] * f);
        } else {
          float* dst = p.o_part + obase * kDv + 448 + 2 * t;
#pragma unroll
          for (int n = 0; n < 8; ++n)
            *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(o[mt][n][2 * hf] * f, o[mt][n][2 * hf + 1] * f);
        }
      }
      if (warp == 0 && t == 0) {
        if (p.splits == 1) p.lse[static_cast<size_t>(row) * p.h + head] = l > 0.f ? lse : INFINITY;
        else p.lse_part[obase] = lse;
      }
    }
}

// Fused split combine of a ds or es kernel (p.counters set): the last split CTA of this (row, head block) to arrive
// merges all splits (same equations as sparse_mla_combine), reading the partials through L2 (ld.cg), and resets
// the counter. last: one int of shared memory.
template <int NTHR, int HB>
__device__ __forceinline__ void ds_fused_combine(const MlaParams& p, int row, int hblk, int tid, int* last) {
  if (p.splits > 1 && p.counters != nullptr) {
    __threadfence();                               // this thread's partials, before the arrival below
    __syncthreads();
    if (tid == 0) {
      const int prev = atomicAdd(p.counters + row * gridDim.y + hblk, 1);
      *last = prev == p.splits - 1;
    }
    __syncthreads();
    if (*last) {
      __threadfence();
      constexpr int TPH = NTHR / HB;   // threads per head
      constexpr int DPT = kDv / TPH;   // dims per thread
      const int r = tid / TPH, c0 = (tid % TPH) * DPT;
      const int head = hblk * HB + r;
      if (head < p.h) {
        const size_t base = static_cast<size_t>(row) * p.splits * p.h + head;
        float m = -INFINITY;
        for (int sp2 = 0; sp2 < p.splits; ++sp2) m = fmaxf(m, __ldcg(p.lse_part + base + static_cast<size_t>(sp2) * p.h));
        float lse = INFINITY, f = 0.f, wsum = 0.f;
        if (m != -INFINITY) {
          for (int sp2 = 0; sp2 < p.splits; ++sp2) wsum += __expf(__ldcg(p.lse_part + base + static_cast<size_t>(sp2) * p.h) - m);
          lse = m + __logf(wsum);
          f = __fdividef(1.f, wsum);
          if (p.sinks) f = __fdividef(f, 1.f + __expf(p.sinks[head] - lse));
        }
        __nv_bfloat16* dst = p.out + (static_cast<size_t>(row) * p.h + head) * kDv + c0;
#pragma unroll 1
        for (int c = 0; c < DPT; c += 8) {
          float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
          if (m != -INFINITY) {
            for (int sp2 = 0; sp2 < p.splits; ++sp2) {
              const size_t b = base + static_cast<size_t>(sp2) * p.h;
              const float w = __expf(__ldcg(p.lse_part + b) - m);   // 0 for an empty split (lse -inf)
              if (w > 0.f) {
                const float4* src = reinterpret_cast<const float4*>(p.o_part + b * kDv + c0 + c);
                const float4 u0 = __ldcg(src), u1 = __ldcg(src + 1);
                acc[0] += w * u0.x; acc[1] += w * u0.y; acc[2] += w * u0.z; acc[3] += w * u0.w;
                acc[4] += w * u1.x; acc[5] += w * u1.y; acc[6] += w * u1.z; acc[7] += w * u1.w;
              }
            }
          }
          uint4 v;
          v.x = pack_bf16(acc[0] * f, acc[1] * f);
          v.y = pack_bf16(acc[2] * f, acc[3] * f);
          v.z = pack_bf16(acc[4] * f, acc[5] * f);
          v.w = pack_bf16(acc[6] * f, acc[7] * f);
          *reinterpret_cast<uint4*>(dst + c) = v;
        }
        if (tid % TPH == 0) p.lse[static_cast<size_t>(row) * p.h + head] = lse;
      }
      if (tid == 0) p.counters[row * gridDim.y + hblk] = 0;   // ready for the next launch on this stream
    }
  }
}

// The ds and es kernels' common prologue: the split's index list (validated, -1 padded to n_fill), the q maxima
// zeroed, the ring's mbarriers initialized (one arrival, with its bytes, per warp), then the barrier that publishes
// all three.
template <int NTHR, int NST, int NW>
__device__ __forceinline__ void ds_prologue(const MlaParams& p, int row, int start, int n_local, int n_fill, int tid,
                                            int* sidx, uint32_t* qmax_s, int heads, uint64_t* full) {
  index_list<NTHR>(p, row, start, n_local, n_fill, tid, sidx);
  if (tid < heads) qmax_s[tid] = 0u;
  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < NST; ++s) mbar_init(full + s, NW);
    mbar_fence_init();
  }
  __syncthreads();
}

// CV (bit mask), bit 2: PV multiplies P (4 f16x2 per k-step) instead of V (16) by the entry's scale relative
// to the warp's running maximum scale, so V stays raw e4m3 in f16 and no f16 range limit applies to the
// dequantized values (measured 2-5% slower than CV = 0 on H200). Bits 0-1 (e4m3 -> f16 on the integer pipe)
// were measured slower and removed (NOTES.md).
template <class L, int MT, int T, int NST, int CV>
__device__ __forceinline__ void ds_body(const MlaParams& p, uint8_t* smem) {
  using S = DsSmem<L, MT, T, NST>;
  constexpr int NW = 8, NTHR = kDsThreads;
  constexpr int HB = S::kHB;
  constexpr int NJ = T / 8;     // QK n-tiles (8 entries each)
  constexpr int KK = T / 16;    // PV k-steps (16 entries each)
  constexpr int REC = L::kRec;  // bytes per entry in the ring (and copied per entry)
  constexpr bool V4 = S::kV4;
  constexpr int NPART = S::kNpart, PS = S::kPS;
  constexpr int HPW = HB / NW;  // heads per owner warp
  constexpr int LPH = 32 / HPW; // lanes per head
  constexpr int EPL = T / LPH;  // entries per owner lane
  constexpr int ROPE = V4 ? 448 : 528;   // RoPE bytes within the record
  static_assert(NST >= 2, "the ring needs a slot in flight while one is read");
  static_assert(T == 32 || T == 64, "tile of 32 or 64 entries");
  static_assert(EPL == 2 || EPL == 4 || EPL == 8, "owner lane covers 2, 4 or 8 entries");
  static_assert(L::kRec % 16 == 0, "records are whole 16-byte chunks");

  uint8_t* raw = smem + S::kRaw;
  float* part = reinterpret_cast<float*>(smem + S::kPart);
  uint8_t* ph = smem + S::kPh;
  uint8_t* pb = smem + S::kPb;
  float* alpha_s = reinterpret_cast<float*>(smem + S::kAlpha);
  float* fin_m = reinterpret_cast<float*>(smem + S::kFinM);
  float* fin_l = reinterpret_cast<float*>(smem + S::kFinL);
  uint32_t* qmax_s = reinterpret_cast<uint32_t*>(smem + S::kQmax);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBar);
  int* sidx = reinterpret_cast<int*>(smem + S::kSidx);

  const int split = blockIdx.x, hblk = blockIdx.y, row = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int ntot = p.topk + p.topk_extra;
  const int start = split * p.per_split;
  const int n_local = max(0, min(p.per_split, ntot - start));
  const int ntiles = (n_local + T - 1) / T;
  const bool rope_warp = V4 && warp == NW - 1;   // V4: warp 7 owns the bf16 RoPE dims 448..511
  const int sbase = warp * 64;                   // this warp's 64 fp8 dims (bytes of the record)

  // Q. fp8 warps: rows 16 mt + g (+8), dims sbase + 16 t .. + 16 (bf16), rescaled to f16 below.
  // Fragment order (k permuted): k-step s, k = 2t, 2t+1 <-> dims 16t + 4s + 0, 1; k = 2t+8, 2t+9 <-> + 2, 3.
  // V4 requests it before the index list: Q does not depend on it, and requested after it (as until 2026-12-03) its
  // round trip followed the index list's instead of overlapping it (NOTES.md "Requests that queued behind others").
  // V3.2 requests it after the ring's first requests, as before: held across the index list, Q's registers took V3.2's
  // 16-head kernels from 126 to 136 registers, one CTA per SM fewer at 256 threads.
  const __nv_bfloat16* qrow = p.q + static_cast<size_t>(row) * p.h * L::kDqk;
  uint32_t qa[MT][4][4];   // fp8 warps: f16, permuted; V4 RoPE warp: bf16, natural order (dims 448..511)
  uint32_t qr[MT][4][4];   // V3.2: bf16 RoPE fragments (dims 512..575), natural order
  uint4 qraw[MT][2][2];
  auto load_q = [&]() {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int head = hblk * HB + 16 * mt + g + 8 * hf;
        const bool ok = head < p.h;
        const __nv_bfloat16* qh = qrow + static_cast<size_t>(head) * L::kDqk;
        if (!rope_warp) {
          uint4 a = make_uint4(0, 0, 0, 0), b = a;
          if (ok) {
            a = __ldg(reinterpret_cast<const uint4*>(qh + sbase + 16 * t));
            b = __ldg(reinterpret_cast<const uint4*>(qh + sbase + 16 * t) + 1);
          }
          qraw[mt][hf][0] = a;
          qraw[mt][hf][1] = b;
        } else {
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            const int d = 448 + 16 * s + 2 * t;
            qa[mt][s][hf] = ok ? __ldg(reinterpret_cast<const unsigned int*>(qh + d)) : 0u;
            qa[mt][s][hf + 2] = ok ? __ldg(reinterpret_cast<const unsigned int*>(qh + d + 8)) : 0u;
          }
        }
      }
  };
  if constexpr (V4) load_q();

  // Index list, validated once: -1 for invalid and for the padding up to the last tile's end; barriers.
  ds_prologue<NTHR, NST, NW>(p, row, start, n_local, ntiles * T, tid, sidx, qmax_s, HB, full);

  auto issue = [&](int ti) { ds_issue<L, T, NST>(p, raw, full, sidx, ti, ntiles, warp, lane); };
  for (int s = 0; s < NST - 1; ++s) issue(s);
  if constexpr (!V4) load_q();

  // V3.2's RoPE dims, then each head row's largest |q| (fp8 warps' dims), for the f16 rescale below.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      if constexpr (!V4) {
        const int head = hblk * HB + 16 * mt + g + 8 * hf;
        const bool ok = head < p.h;
        const __nv_bfloat16* qh = qrow + static_cast<size_t>(head) * L::kDqk;
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const int d = 512 + 16 * s + 2 * t;
          qr[mt][s][hf] = ok ? __ldg(reinterpret_cast<const unsigned int*>(qh + d)) : 0u;
          qr[mt][s][hf + 2] = ok ? __ldg(reinterpret_cast<const unsigned int*>(qh + d + 8)) : 0u;
        }
      }
      if (rope_warp) continue;
      const uint4 a = qraw[mt][hf][0], b = qraw[mt][hf][1];
      const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      uint32_t m = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) m = max(m, max(w[i] & 0x7fffu, (w[i] >> 16) & 0x7fffu));
      m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = max(m, __shfl_xor_sync(0xffffffffu, m, 2));
      if (t == 0) atomicMax(qmax_s + 16 * mt + g + 8 * hf, m << 16);   // |bf16| bits -> fp32 bits
    }
  __syncthreads();   // q maxima complete; the prologue's zero fills visible

  float rf[MT][2];   // 2^k of this thread's rows: RoPE partials are brought to the same units
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int k = q_shift(qmax_s[16 * mt + g + 8 * hf]);
      const float f = exp2i(k);
      rf[mt][hf] = f;
      if (!rope_warp) {
        const uint4 a = qraw[mt][hf][0], b = qraw[mt][hf][1];
        const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        uint32_t h2[8];
#pragma unroll
        for (int i = 0; i < 8; ++i)
          h2[i] = pack_f16(__uint_as_float(w[i] << 16) * f, __uint_as_float(w[i] & 0xffff0000u) * f);
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          qa[mt][s][hf] = h2[2 * s];
          qa[mt][s][hf + 2] = h2[2 * s + 1];
        }
      }
    }

  // Owner of head row orow for the softmax: lanes [LPH * (lane / LPH), ...) cover its T entries.
  const int orow = warp * HPW + lane / LPH;
  const int oe0 = (lane % LPH) * EPL;
  const float qf = p.scale_log2 * exp2i(-q_shift(qmax_s[orow]));
  float m_run = -INFINITY, l_run = 0.f;
  float ref_run = 0.f;   // CV & 4: running maximum scale of this warp's group (fp8 warps)

  float o[MT][8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;

  for (int it = 0; it < ntiles; ++it) {
    const int slot = it % NST;
    mbar_wait(full + slot, static_cast<uint32_t>(it / NST) & 1u);
    const uint8_t* rt = raw + slot * (T * REC);
    const int* tidx = sidx + it * T;

    // ---- QK partials ----
    uint32_t sp[NJ];   // f16x2 scale pairs of entries 8j + 2t, 8j + 2t + 1 (fp8 warps, for PV)
    float ref_ratio = 1.f;   // CV & 4: old / new running maximum scale (rescales the accumulator)
    if (!rope_warp) {
      float sc[NJ][2];
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const int e = 8 * j + 2 * t;
        if constexpr (V4) {
          const int2 v2 = *reinterpret_cast<const int2*>(tidx + e);
          const uint32_t b0 = rt[e * REC + 576 + 8 * (entry_offset(p, v2.x) & 1) + warp];
          const uint32_t b1 = rt[(e + 1) * REC + 576 + 8 * (entry_offset(p, v2.y) & 1) + warp];
          sc[j][0] = __uint_as_float(b0 << 23);
          sc[j][1] = __uint_as_float(b1 << 23);
        } else {
          sc[j][0] = *reinterpret_cast<const float*>(rt + e * REC + 512 + 4 * (warp >> 1));
          sc[j][1] = *reinterpret_cast<const float*>(rt + (e + 1) * REC + 512 + 4 * (warp >> 1));
        }
      }
      // PV takes the scale in f16. CV & 4: relative to this warp's running maximum scale ref (the accumulator
      // holds O / ref), so the f16 factor is <= 1.
      float kv = 1.f;
      if constexpr (CV & 4) {
        float mx = 0.f;
#pragma unroll
        for (int j = 0; j < NJ; ++j) mx = fmaxf(mx, fmaxf(fabsf(sc[j][0]), fabsf(sc[j][1])));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));   // lanes t = 0..3 cover the tile's entries
        const float ref_new = fmaxf(ref_run, mx);
        ref_ratio = ref_new > 0.f ? ref_run / ref_new : 1.f;
        ref_run = ref_new;
        if (ref_new > 0.f) kv *= 1.f / ref_new;
        else kv = 0.f;
      }
#pragma unroll
      for (int j = 0; j < NJ; ++j) sp[j] = pack_f16(sc[j][0] * kv, sc[j][1] * kv);
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const uint4 u = *reinterpret_cast<const uint4*>(rt + (8 * j + g) * REC + sbase + 16 * t);
        uint32_t b[4][2];
        cvt_e4m3x4(u.x, b[0][0], b[0][1]);
        cvt_e4m3x4(u.y, b[1][0], b[1][1]);
        cvt_e4m3x4(u.z, b[2][0], b[2][1]);
        cvt_e4m3x4(u.w, b[3][0], b[3][1]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int s = 0; s < 4; ++s) mma_f16(acc, qa[mt][s], b[s][0], b[s][1]);
          float* dst = part + (warp * HB + 16 * mt + g) * PS + 8 * j + 2 * t;
          *reinterpret_cast<float2*>(dst) = make_float2(acc[0] * sc[j][0], acc[1] * sc[j][1]);
          *reinterpret_cast<float2*>(dst + 8 * PS) = make_float2(acc[2] * sc[j][0], acc[3] * sc[j][1]);
        }
      }
      if (!V4 && warp < NJ) {
        // RoPE dims of entries 8 warp .. 8 warp + 7 (bf16 in the record), into partial slice 8 (T = 32:
        // warps 0-3 only).
        float acc[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
#pragma unroll
        for (int s2 = 0; s2 < 2; ++s2) {
          uint32_t bb[4];
          ldsm_x4(bb, rt + (8 * warp + (lane & 7)) * REC + ROPE + (4 * s2 + (lane >> 3)) * 16);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(acc[mt], qr[mt][2 * s2], bb[0], bb[1]);
            mma_bf16(acc[mt], qr[mt][2 * s2 + 1], bb[2], bb[3]);
          }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float* dst = part + (8 * HB + 16 * mt + g) * PS + 8 * warp + 2 * t;
          *reinterpret_cast<float2*>(dst) = make_float2(acc[mt][0] * rf[mt][0], acc[mt][1] * rf[mt][0]);
          *reinterpret_cast<float2*>(dst + 8 * PS) = make_float2(acc[mt][2] * rf[mt][1], acc[mt][3] * rf[mt][1]);
        }
      }
    } else {
      // V4 RoPE warp: dims 448..511 (bf16) of every entry.
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        float acc[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
#pragma unroll
        for (int s2 = 0; s2 < 2; ++s2) {
          uint32_t bb[4];
          ldsm_x4(bb, rt + (8 * j + (lane & 7)) * REC + ROPE + (4 * s2 + (lane >> 3)) * 16);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(acc[mt], qa[mt][2 * s2], bb[0], bb[1]);
            mma_bf16(acc[mt], qa[mt][2 * s2 + 1], bb[2], bb[3]);
          }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float* dst = part + (warp * HB + 16 * mt + g) * PS + 8 * j + 2 * t;
          *reinterpret_cast<float2*>(dst) = make_float2(acc[mt][0] * rf[mt][0], acc[mt][1] * rf[mt][0]);
          *reinterpret_cast<float2*>(dst + 8 * PS) = make_float2(acc[mt][2] * rf[mt][1], acc[mt][3] * rf[mt][1]);
        }
      }
    }
    __syncthreads();   // A: partials complete; every warp is done with tile it-1 (its slot is refilled now)
    issue(it + NST - 1);

    // ---- softmax by the owner warps: no exchange between warps ----
    {
      float sv[EPL];
#pragma unroll
      for (int i = 0; i < EPL; ++i) sv[i] = 0.f;
#pragma unroll
      for (int pp = 0; pp < NPART; ++pp) {
        const float* src = part + (pp * HB + orow) * PS + oe0;
        if constexpr (EPL == 2) {
          const float2 v = *reinterpret_cast<const float2*>(src);
          sv[0] += v.x;
          sv[1] += v.y;
        } else {
#pragma unroll
          for (int i = 0; i < EPL; i += 4) {
            const float4 v = *reinterpret_cast<const float4*>(src + i);
            sv[i] += v.x;
            sv[i + 1] += v.y;
            sv[i + 2] += v.z;
            sv[i + 3] += v.w;
          }
        }
      }
      float mx = -INFINITY;
#pragma unroll
      for (int i = 0; i < EPL; ++i) {
        sv[i] = tidx[oe0 + i] >= 0 ? sv[i] * qf : -INFINITY;
        mx = fmaxf(mx, sv[i]);
      }
#pragma unroll
      for (int off = LPH / 2; off >= 1; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m_run, mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;   // all invalid so far: exp2(-inf) = 0, no NaN
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < EPL; ++i) {
        sv[i] = exp2f(sv[i] - m_use);
        sum += sv[i];
      }
#pragma unroll
      for (int off = LPH / 2; off >= 1; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      const float alpha = exp2f(m_run - m_use);
      l_run = l_run * alpha + sum;
      m_run = m_new;
      uint32_t hp[EPL / 2], bp[EPL / 2];
#pragma unroll
      for (int i = 0; i < EPL / 2; ++i) {
        hp[i] = pack_f16(sv[2 * i], sv[2 * i + 1]);
        bp[i] = pack_bf16(sv[2 * i], sv[2 * i + 1]);
      }
      const int poff = pswz<T>(orow, oe0 >> 3) + (oe0 & 7) * 2;
      if constexpr (EPL == 2) {
        *reinterpret_cast<uint32_t*>(ph + poff) = hp[0];
        if constexpr (V4) *reinterpret_cast<uint32_t*>(pb + poff) = bp[0];
      } else if constexpr (EPL == 4) {
        *reinterpret_cast<uint2*>(ph + poff) = make_uint2(hp[0], hp[1]);
        if constexpr (V4) *reinterpret_cast<uint2*>(pb + poff) = make_uint2(bp[0], bp[1]);
      } else {
        *reinterpret_cast<uint4*>(ph + poff) = make_uint4(hp[0], hp[1], hp[2], hp[3]);
        if constexpr (V4) *reinterpret_cast<uint4*>(pb + poff) = make_uint4(bp[0], bp[1], bp[2], bp[3]);
      }
      if (lane % LPH == 0) alpha_s[orow] = alpha;
    }
    __syncthreads();   // B: P and alpha complete

    // ---- PV: this warp's 64 output dims ----
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const float a0 = alpha_s[16 * mt + g] * ref_ratio, a1 = alpha_s[16 * mt + g + 8] * ref_ratio;
#pragma unroll
      for (int n = 0; n < 8; ++n) {
        o[mt][n][0] *= a0;
        o[mt][n][1] *= a0;
        o[mt][n][2] *= a1;
        o[mt][n][3] *= a1;
      }
    }
    if (!rope_warp) {
#pragma unroll
      for (int kk = 0; kk < KK; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[mt], ph + pswz<T>(16 * mt + (lane & 15), 2 * kk + (lane >> 4)));
        ds_pv_fp8<L, MT, CV>(o, a, rt, kk, sbase, g, t, sp[2 * kk], sp[2 * kk + 1]);
      }
    } else {   // V4 RoPE warp
#pragma unroll
      for (int kk = 0; kk < KK; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[mt], pb + pswz<T>(16 * mt + (lane & 15), 2 * kk + (lane >> 4)));
        ds_pv_rope<L, MT>(o, a, rt, kk, lane);
      }
    }
  }

  // Epilogue: the owners publish m and l; every warp writes its dims.
  if (lane % LPH == 0) {
    fin_m[orow] = m_run;
    fin_l[orow] = l_run;
  }
  __syncthreads();
  ds_write_out<MT, CV>(p, o, [&](int, int, int r) { return make_float2(fin_m[r], fin_l[r]); }, ref_run, rope_warp,
                       row, split, hblk, warp, g, t);
  ds_fused_combine<NTHR, HB>(p, row, hblk, tid, reinterpret_cast<int*>(qmax_s));   // q maxima no longer needed
}

// ---- "es" kernels (fp8, mma.sync): warps split the tile's entries for QK, the head dimension for PV ----
//
// Why (NOTES.md "es kernels"): ncu on the 16-head ds kernel at V4 CSA B=64 (2026-12-02) reads 0.37 instructions
// issued per scheduler-cycle and ~500 warp-instructions per warp per 32-entry tile, a third of them the exchange
// of 8 partial-S slices, the owners' softmax and the second block barrier. Here, per 64-entry tile:
//   * QK: warp w computes S for the CTA's heads x entries 8w .. 8w+7 over the whole d_qk: the entry's e4m3 bytes
//     converted inside the MMA's B operand (`cvt.rn.f16x2.e4m3x2`, k permuted so that one 16-byte load feeds four
//     k-steps, as in the ds kernels), Q read as ready-made A fragments from shared memory (f16 x 2^k per head),
//     one fp32 accumulator per scale, times the entry's scale; S is written once, in log2 units, masked;
//   * one block barrier; then every warp runs the online softmax of its heads over the whole tile itself: a
//     thread's 16 values per head are exactly its PV A fragments, so P never goes through shared memory and every
//     warp holds the same running maximum and sum; PV for the warp's 64 output dims as the ds kernels (ds_pv_fp8;
//     the V4 RoPE warp ds_pv_rope);
//   * S and the scales are double-buffered, so one warp's QK of tile i+1 overlaps another's PV of tile i.
// Same equations, outputs, split protocol and range as the ds kernels with CV = 0. Measured on H200 (NOTES.md):
// correct, not faster (V4 CSA h=16 B=64 33.6 against 30.0 us): the softmax done by every warp and the larger tile's
// refill cost more instructions than the exchange they replace. Tuning build only.
template <class L, int MT, int NST>
__device__ __forceinline__ void es_body(const MlaParams& p, uint8_t* smem) {
  using S = EsSmem<L, MT, NST>;
  constexpr int T = kEsT, NW = 8, NTHR = kDsThreads, HB = S::kHB;
  constexpr int NG = S::kGroups, NSC = S::kScales, GPS = NG / NSC;   // 64-dim groups per scale: V4 1, V3.2 2
  constexpr int REC = L::kRec, SS = S::kSS;
  constexpr bool V4 = S::kV4;
  constexpr int ROPE = V4 ? 448 : 528;        // RoPE bytes within the record
  constexpr int QROPE = V4 ? 448 : 512;       // first RoPE dim of q
  constexpr int NQ = MT * NG * 32;            // NoPE fragment items: (mt, group, lane)
  constexpr int QPT = (NQ + NTHR - 1) / NTHR;
  static_assert(NST >= 2, "the ring needs a slot in flight while one is read");
  static_assert(MT * 128 <= NTHR, "one RoPE fragment item per thread");
  static_assert(NG % NSC == 0, "whole groups per scale");

  uint8_t* raw = smem + S::kRaw;
  uint4* qf = reinterpret_cast<uint4*>(smem + S::kQf);
  uint4* qr = reinterpret_cast<uint4*>(smem + S::kQr);
  float* sbuf = reinterpret_cast<float*>(smem + S::kS);
  float* scl = reinterpret_cast<float*>(smem + S::kScl);
  uint32_t* qmax_s = reinterpret_cast<uint32_t*>(smem + S::kQmax);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBar);
  int* sidx = reinterpret_cast<int*>(smem + S::kSidx);

  const int split = blockIdx.x, hblk = blockIdx.y, row = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int ntot = p.topk + p.topk_extra;
  const int start = split * p.per_split;
  const int n_local = max(0, min(p.per_split, ntot - start));
  const int ntiles = (n_local + T - 1) / T;
  const bool rope_warp = V4 && warp == NW - 1;   // V4: warp 7's PV owns the bf16 RoPE dims 448..511
  const __nv_bfloat16* qrow = p.q + static_cast<size_t>(row) * p.h * L::kDqk;

  // Q's loads first, so that they are in flight with the index list's. NoPE item i (thread tid + k NTHR): head
  // rows 16 mt + g' and + 8, dims 64 grp + 16 t' .. + 16 (g', t' its fragment lane, i % 32 = this lane).
  uint4 qraw[QPT][2][2];
#pragma unroll
  for (int k = 0; k < QPT; ++k) {
    const int i = tid + k * NTHR, mt = i / (NG * 32), grp = (i / 32) % NG;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int head = hblk * HB + 16 * mt + g + 8 * hf;
      uint4 a = make_uint4(0, 0, 0, 0), b = a;
      if (i < NQ && head < p.h) {
        const uint4* src =
            reinterpret_cast<const uint4*>(qrow + static_cast<size_t>(head) * L::kDqk + 64 * grp + 16 * t);
        a = __ldg(src);
        b = __ldg(src + 1);
      }
      qraw[k][hf][0] = a;
      qraw[k][hf][1] = b;
    }
  }
  // RoPE item tid < MT * 128: k-step s = (tid / 32) % 4 of head block mt = tid / 128, bf16, natural order (the ds
  // kernels' RoPE fragments), unscaled.
  uint32_t rraw[4] = {0u, 0u, 0u, 0u};
  if (tid < MT * 128) {
    const int mt = tid / 128, s = (tid / 32) % 4;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int head = hblk * HB + 16 * mt + g + 8 * hf;
      if (head < p.h) {
        const __nv_bfloat16* qh = qrow + static_cast<size_t>(head) * L::kDqk + QROPE + 16 * s + 2 * t;
        rraw[hf] = __ldg(reinterpret_cast<const unsigned int*>(qh));
        rraw[hf + 2] = __ldg(reinterpret_cast<const unsigned int*>(qh + 8));
      }
    }
  }

  ds_prologue<NTHR, NST, NW>(p, row, start, n_local, ntiles * T, tid, sidx, qmax_s, HB, full);
  for (int s = 0; s < NST - 1; ++s) ds_issue<L, T, NST>(p, raw, full, sidx, s, ntiles, warp, lane);

  // Per head the maximum |q| over the NoPE dims (a warp's items share mt and grp: reduce over t' first).
#pragma unroll
  for (int k = 0; k < QPT; ++k) {
    const int i = tid + k * NTHR, mt = i / (NG * 32);
    if (i >= NQ) continue;   // whole warps
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const uint4 a = qraw[k][hf][0], b = qraw[k][hf][1];
      const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      uint32_t m = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) m = max(m, max(w[j] & 0x7fffu, (w[j] >> 16) & 0x7fffu));
      m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));
      m = max(m, __shfl_xor_sync(0xffffffffu, m, 2));
      if (t == 0) atomicMax(qmax_s + 16 * mt + g + 8 * hf, m << 16);   // |bf16| bits -> fp32 bits
    }
  }
  __syncthreads();   // q maxima complete

  // Q fragments: k-step s of group grp, A registers {row g, row g + 8} x {dims 16 t + 4 s + 0..1, + 2..3}, in f16
  // x 2^k per head (the ds kernels' q_shift: exact, no f16 range limit on q).
#pragma unroll
  for (int k = 0; k < QPT; ++k) {
    const int i = tid + k * NTHR, mt = i / (NG * 32), grp = (i / 32) % NG;
    if (i >= NQ) continue;
    uint32_t h2[2][8];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const float f = exp2i(q_shift(qmax_s[16 * mt + g + 8 * hf]));
      const uint4 a = qraw[k][hf][0], b = qraw[k][hf][1];
      const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
      for (int j = 0; j < 8; ++j)
        h2[hf][j] = pack_f16(__uint_as_float(w[j] << 16) * f, __uint_as_float(w[j] & 0xffff0000u) * f);
    }
#pragma unroll
    for (int s = 0; s < 4; ++s)
      qf[((mt * NG + grp) * 4 + s) * 32 + lane] =
          make_uint4(h2[0][2 * s], h2[1][2 * s], h2[0][2 * s + 1], h2[1][2 * s + 1]);
  }
  if (tid < MT * 128) qr[tid] = make_uint4(rraw[0], rraw[1], rraw[2], rraw[3]);
  // This thread's rows r = 16 mt + g + 8 hf: S = NoPE accumulator x scale_log2 x 2^-k + RoPE accumulator x scale_log2.
  float qfr[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) qfr[mt][hf] = p.scale_log2 * exp2i(-q_shift(qmax_s[16 * mt + g + 8 * hf]));
  __syncthreads();   // Q fragments written

  float m_run[MT][2], l_run[MT][2];
  float o[MT][8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      m_run[mt][hf] = -INFINITY;
      l_run[mt][hf] = 0.f;
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  }
  // S positions (floats within a row): entry e = 16 kk + 8 hh + 2 t + i sits at t 16 + (t / 2) 4 + kk 4 + hh 2 + i,
  // so the softmax reads a thread's 16 entries (its PV A fragments) as 4 conflict-free 16-byte loads.
  const int e_c = 8 * warp + 2 * t;                                                 // QK accumulator entries e_c, + 1
  const int spos = t * 16 + (t >> 1) * 4 + (warp >> 1) * 4 + (warp & 1) * 2;        // ... and their S position
  const int rpos = t * 16 + (t >> 1) * 4;                                           // softmax: this thread's 16

  for (int it = 0; it < ntiles; ++it) {
    const int slot = it % NST;
    mbar_wait(full + slot, static_cast<uint32_t>(it / NST) & 1u);
    const uint8_t* rt = raw + slot * (T * REC);
    float* st = sbuf + (it & 1) * (HB * SS);
    float* sct = scl + (it & 1) * (NSC * T);

    // ---- QK: S of entries 8 warp .. 8 warp + 7 ----
    {
      const int2 v2 = *reinterpret_cast<const int2*>(sidx + it * T + e_c);
      float sc0[NSC], sc1[NSC];   // scales of entries e_c, e_c + 1
      if constexpr (V4) {
        // The 8-byte UE8M0 record sits in the copied 16-byte pair at 8 x (offset & 1); zeros for invalid entries.
        const uint2 r0 = *reinterpret_cast<const uint2*>(rt + e_c * REC + 576 + 8 * (entry_offset(p, v2.x) & 1));
        const uint2 r1 = *reinterpret_cast<const uint2*>(rt + (e_c + 1) * REC + 576 + 8 * (entry_offset(p, v2.y) & 1));
#pragma unroll
        for (int j = 0; j < NSC; ++j) {
          sc0[j] = __uint_as_float((((j < 4 ? r0.x : r0.y) >> (8 * (j & 3))) & 0xffu) << 23);
          sc1[j] = __uint_as_float((((j < 4 ? r1.x : r1.y) >> (8 * (j & 3))) & 0xffu) << 23);
        }
      } else {
        const float4 a0 = *reinterpret_cast<const float4*>(rt + e_c * REC + 512);
        const float4 a1 = *reinterpret_cast<const float4*>(rt + (e_c + 1) * REC + 512);
        sc0[0] = a0.x, sc0[1] = a0.y, sc0[2] = a0.z, sc0[3] = a0.w;
        sc1[0] = a1.x, sc1[1] = a1.y, sc1[2] = a1.z, sc1[3] = a1.w;
      }
#pragma unroll
      for (int j = 0; j < NSC; ++j) *reinterpret_cast<float2*>(sct + j * T + e_c) = make_float2(sc0[j], sc1[j]);

      float sacc[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) sacc[mt][0] = sacc[mt][1] = sacc[mt][2] = sacc[mt][3] = 0.f;
      const uint8_t* kb = rt + (8 * warp + g) * REC + 16 * t;   // B operand: entry 8 warp + g
#pragma unroll
      for (int j = 0; j < NSC; ++j) {
        float acc[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
#pragma unroll
        for (int gg = 0; gg < GPS; ++gg) {
          const int grp = j * GPS + gg;
          const uint4 u = *reinterpret_cast<const uint4*>(kb + 64 * grp);
          uint32_t b[4][2];
          cvt_e4m3x4(u.x, b[0][0], b[0][1]);
          cvt_e4m3x4(u.y, b[1][0], b[1][1]);
          cvt_e4m3x4(u.z, b[2][0], b[2][1]);
          cvt_e4m3x4(u.w, b[3][0], b[3][1]);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int s = 0; s < 4; ++s) {
              const uint4 qv = qf[((mt * NG + grp) * 4 + s) * 32 + lane];
              const uint32_t qa[4] = {qv.x, qv.y, qv.z, qv.w};
              mma_f16(acc[mt], qa, b[s][0], b[s][1]);
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          sacc[mt][0] += acc[mt][0] * sc0[j];
          sacc[mt][1] += acc[mt][1] * sc1[j];
          sacc[mt][2] += acc[mt][2] * sc0[j];
          sacc[mt][3] += acc[mt][3] * sc1[j];
        }
      }
      float racc[MT][4];   // RoPE dims (bf16 in the record)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) racc[mt][0] = racc[mt][1] = racc[mt][2] = racc[mt][3] = 0.f;
#pragma unroll
      for (int s2 = 0; s2 < 2; ++s2) {
        uint32_t bb[4];
        ldsm_x4(bb, rt + (8 * warp + (lane & 7)) * REC + ROPE + (4 * s2 + (lane >> 3)) * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint4 q0 = qr[(mt * 4 + 2 * s2) * 32 + lane], q1 = qr[(mt * 4 + 2 * s2 + 1) * 32 + lane];
          const uint32_t qa0[4] = {q0.x, q0.y, q0.z, q0.w}, qa1[4] = {q1.x, q1.y, q1.z, q1.w};
          mma_bf16(racc[mt], qa0, bb[0], bb[1]);
          mma_bf16(racc[mt], qa1, bb[2], bb[3]);
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const float x0 = v2.x >= 0 ? sacc[mt][2 * hf] * qfr[mt][hf] + racc[mt][2 * hf] * p.scale_log2 : -INFINITY;
          const float x1 = v2.y >= 0 ? sacc[mt][2 * hf + 1] * qfr[mt][hf] + racc[mt][2 * hf + 1] * p.scale_log2
                                     : -INFINITY;
          *reinterpret_cast<float2*>(st + (16 * mt + g + 8 * hf) * SS + spos) = make_float2(x0, x1);
        }
    }
    __syncthreads();   // S of tile it complete; every warp is done with tile it-1 (its slot is refilled now)
    ds_issue<L, T, NST>(p, raw, full, sidx, it + NST - 1, ntiles, warp, lane);

    // ---- online softmax of this thread's rows over the tile (every warp alike), P as PV A fragments ----
    uint32_t pa[MT][4][4];   // [mt][k-step kk][A register]
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const float4* src = reinterpret_cast<const float4*>(st + (16 * mt + g + 8 * hf) * SS + rpos);
        float x[4][4];   // [kk]: entries 16 kk + 2t, + 1, 16 kk + 8 + 2t, + 1
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const float4 v = src[kk];
          x[kk][0] = v.x, x[kk][1] = v.y, x[kk][2] = v.z, x[kk][3] = v.w;
        }
        float mx = -INFINITY;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          mx = fmaxf(fmaxf(mx, fmaxf(x[kk][0], x[kk][1])), fmaxf(x[kk][2], x[kk][3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[mt][hf], mx);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;   // all invalid so far: exp2(-inf) = 0, no NaN
        float sum = 0.f;
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            x[kk][c] = exp2f(x[kk][c] - m_use);
            sum += x[kk][c];
          }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        const float alpha = exp2f(m_run[mt][hf] - m_use);
        l_run[mt][hf] = l_run[mt][hf] * alpha + sum;
        m_run[mt][hf] = m_new;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          o[mt][n][2 * hf] *= alpha;
          o[mt][n][2 * hf + 1] *= alpha;
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {   // the RoPE warp multiplies bf16 V: P in bf16; the others f16
          pa[mt][kk][hf] = rope_warp ? pack_bf16(x[kk][0], x[kk][1]) : pack_f16(x[kk][0], x[kk][1]);
          pa[mt][kk][hf + 2] = rope_warp ? pack_bf16(x[kk][2], x[kk][3]) : pack_f16(x[kk][2], x[kk][3]);
        }
      }

    // ---- PV: this warp's 64 output dims ----
    if (!rope_warp) {
      const float* scw = sct + (V4 ? warp : warp >> 1) * T + 2 * t;   // the scale of this warp's dims
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const float2 c01 = *reinterpret_cast<const float2*>(scw + 16 * kk);
        const float2 c89 = *reinterpret_cast<const float2*>(scw + 16 * kk + 8);
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) a[mt][0] = pa[mt][kk][0], a[mt][1] = pa[mt][kk][1], a[mt][2] = pa[mt][kk][2],
                                        a[mt][3] = pa[mt][kk][3];
        ds_pv_fp8<L, MT, 0>(o, a, rt, kk, warp * 64, g, t, pack_f16(c01.x, c01.y), pack_f16(c89.x, c89.y));
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) a[mt][0] = pa[mt][kk][0], a[mt][1] = pa[mt][kk][1], a[mt][2] = pa[mt][kk][2],
                                        a[mt][3] = pa[mt][kk][3];
        ds_pv_rope<L, MT>(o, a, rt, kk, lane);
      }
    }
  }

  ds_write_out<MT, 0>(p, o, [&](int mt, int hf, int) { return make_float2(m_run[mt][hf], l_run[mt][hf]); }, 1.f,
                      rope_warp, row, split, hblk, warp, g, t);
  ds_fused_combine<NTHR, HB>(p, row, hblk, tid, reinterpret_cast<int*>(qmax_s));   // q maxima no longer needed
}

// ---- "wg" kernels (sm_90a only): wgmma, 64 heads per CTA, one producer and two consumer warpgroups ----
//
// Why: at 64-128 heads the mma.sync kernels above stall at ~130 TFLOP/s (every warp re-reads its operands
// through ldmatrix, and the tile is converted once per 16/32-head block). Here one CTA serves 64 heads of a
// row, the tile is converted once for all of them, and the tensor cores read both operands of QK and the V
// operand of PV straight from shared memory (wgmma):
//   * warpgroup 2 (producer): one lane per entry issues the bulk copy of the record into an NST-stage ring
//     (mbarrier transaction counts); all 128 threads convert the tile into a bf16 [T x d_qk] tile (two
//     buffers; 128B-swizzled 64-dim column blocks, the canonical wgmma layout; invalid entries zeroed);
//   * warpgroup 0: S = Q K^T (m64n32k16, Q and the tile from shared memory), masking, online softmax in
//     registers (a thread holds 2 heads x 8 entries, so row maxima need only quad shuffles), P as the A
//     operand from registers for O[:, 0:256] += P V (m64n256k16, V = the same tile read MN-major); it hands
//     P and the rescale factors to warpgroup 1 through shared memory;
//   * warpgroup 1: O[:, 256:512] += P V with warpgroup 0's P.
// Hand-offs are named barriers (tile full / tile free per buffer, P full / P free per buffer), so the
// producer converts tile i+1 and warpgroup 1 multiplies tile i while warpgroup 0 computes QK of tile i+1.
// Same equations, outputs and split protocol as the kernels above. Variants: _c2 (SC: warpgroup 1 converts
// half of every tile), _h (H: f16 tile, range-limited), _x<bits> (PROBE: wrong results, kernels/tuning build only).
// Measured on H200 (NOTES.md, "wg kernels"): 1.2-1.9x faster than the kernels above from 8 rows at h >= 64;
// still producer-bound (conversion + gather issue on one warp per SM sub-partition), not tensor-bound.
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
// out in each body (cuobjdump -sass of both targets, function by function, 2026-12-01). Still written out in
// both, because as helpers they changed the SASS (ptxas renumbered the consumers' registers): the per-head Q
// exponents, the gather issue, the online softmax and the epilogue's (m, l) hand-over.

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

// PROBE (tuning only): bit 0 = the producer skips the conversion, bit 1 = the consumers skip the wgmma
// instructions (results wrong; timings say which side bounds a tile).
// H: the tile, Q and P in f16 instead of bf16 (2 instructions per converted pair instead of ~6; range limit:
// |e4m3 x scale| and |RoPE| must stay below 65504, exact for power-of-two scales 2^-15 .. 2^7 (V3.2's
// non-power-of-two scales are rounded, as in the bf16 path); Q is scaled per head by a power of two into
// [2^14, 2^15) and S scaled back).
// SC (split conversion): warpgroup 1, idle while warpgroup 0 computes QK and the softmax, converts the second
// half of each tile's entries (after its PV of the tile two back), the producer the first half; the producer
// re-fills a ring slot only after warpgroup 1 has converted from it (mbarrier raw_free[slot]: a named barrier
// could let warpgroup 1's two prologue arrivals complete one phase without the producer).
template <class L, int NST, int PROBE, bool H, bool SC, bool PAIRS>
__device__ __forceinline__ void wg_body(const MlaParams& p, uint8_t* smem_raw) {
  using S = WgSmem<L, NST>;
  constexpr int T = kWgT;
  constexpr int DQK = L::kDqk;
  constexpr int REC = L::kRec;
  constexpr bool V4 = DQK == 512;
  constexpr int NCH = L::kNope / 16;   // fp8 chunks of 16 values per entry
  static_assert(NST >= 2, "the ring needs a slot in flight while one is converted");
  static_assert(L::kNope % 64 == 0 && kWgT == 32, "4 threads per entry, whole 64-dim column blocks");
  static_assert(REC % 16 == 0, "records are whole 16-byte chunks");
  const uint32_t base_u = smem_u32(smem_raw);
  uint8_t* smem = smem_raw + (((base_u + 1023u) & ~1023u) - base_u);   // swizzle atoms need 1024 B alignment

  uint8_t* qs = smem + S::kQ;
  static_assert(S::kTile - S::kQ >= 2 * kWgStageBytes, "the epilogue stages both warpgroups' rows in Q");
  uint8_t* tiles = smem + S::kTile;
  uint8_t* raw = smem + S::kRaw;
  uint8_t* pbuf = smem + S::kP;
  float4* fin = reinterpret_cast<float4*>(smem + S::kFin);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBar);
  uint64_t* raw_free = full + NST;         // SC: [NST], one arrival per warp of warpgroup 1
  int* sidx = reinterpret_cast<int*>(smem + S::kSidx);

  const int split = blockIdx.x, hblk = blockIdx.y, row = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2;
  const int ntot = p.topk + p.topk_extra;
  const int start = split * p.per_split;
  const int n_local = max(0, min(p.per_split, ntot - start));
  const int ntiles = (n_local + T - 1) / T;

  // Q block (heads past h are zero) requested first (not H: bf16 as stored), so its round trip overlaps the index
  // list's; waited for before the ring's barriers are initialized.
  if constexpr (!H)
    q_block_async<DQK>(p, row, hblk * 64, 64, tid, kWgThreads, [&](int r, int c) { return qs + wg_swz<64>(r, c); });
  // Index list, validated once: -1 for invalid entries and the padding up to the last tile's end.
  index_list<kWgThreads>(p, row, start, n_local, ntiles * T, tid, sidx);
  // H: per-head power-of-two exponent k that puts max |q| into [2^14, 2^15) (warp w: heads w, w + 12, ...).
  int* qexp = reinterpret_cast<int*>(fin);   // fin is not used before the epilogue
  if constexpr (H) {
    for (int r = warp; r < 64; r += kWgThreads / 32) {
      const int head = hblk * 64 + r;
      uint32_t m = 0;
      if (head < p.h) {
        const uint4* qh = reinterpret_cast<const uint4*>(p.q + (static_cast<size_t>(row) * p.h + head) * DQK);
        for (int c = lane; c < DQK / 8; c += 32) {
          const uint4 v = __ldg(qh + c);
          const uint32_t x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) m = max(m, max(x[i] & 0x7fffu, (x[i] >> 16) & 0x7fffu));
        }
      }
#pragma unroll
      for (int o = 16; o; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
      if (lane == 0) qexp[r] = q_shift(m << 16);
    }
    __syncthreads();
  }
  if constexpr (!H) {
    cp_async_commit();   // wait_group covers committed groups only
    cp_async_wait<0>();
  } else {   // the Q block (heads past h are zero) into the swizzled layout in f16 times 2^k of its head
    for (int i = tid; i < 64 * (DQK / 8); i += kWgThreads) {
      const int r = i / (DQK / 8), c = i - r * (DQK / 8);
      const int head = hblk * 64 + r;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (head < p.h)
        v = __ldg(reinterpret_cast<const uint4*>(p.q + (static_cast<size_t>(row) * p.h + head) * DQK) + c);
      const float f = exp2i(qexp[r]);
      const uint32_t x[4] = {v.x, v.y, v.z, v.w};
      uint32_t y[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        y[k] = pack_f16(__uint_as_float(x[k] << 16) * f, __uint_as_float(x[k] & 0xffff0000u) * f);
      *reinterpret_cast<uint4*>(qs + wg_swz<64>(r, c)) = make_uint4(y[0], y[1], y[2], y[3]);
    }
  }
  wg_ring_init<NST, SC>(tid, full, raw_free);

  // SC: convert entries 16 half .. 16 half + 15 of tile x (ring slot x % NST) into tile buffer x & 1, with the
  // 128 threads of one warpgroup (ltid): 8 threads per entry, thread j taking the fp8 chunks j + 8 k and RoPE
  // chunk j.
  auto convert_half = [&](int x, int half, int ltid) {
    const int e = 16 * half + (ltid >> 3), j = ltid & 7;
    const int v = sidx[x * T + e];
    const uint8_t* rec = raw + ((x % NST) * T + e) * REC;
    uint8_t* tile = tiles + (x & 1) * S::kTileBytes;
    constexpr int K8 = (NCH + 7) / 8;
    const uint8_t* srec = V4 ? rec + 8 * (entry_offset(p, v) & 1) : rec;
    uint4 w[K8];
#pragma unroll
    for (int k = 0; k < K8; ++k)
      w[k] = (v >= 0 && j + 8 * k < NCH) ? *reinterpret_cast<const uint4*>(rec + (j + 8 * k) * 16)
                                          : make_uint4(0, 0, 0, 0);
    uint4 r = v >= 0 ? *reinterpret_cast<const uint4*>(rec + L::kRopeRaw + j * 16) : make_uint4(0, 0, 0, 0);
    if constexpr (H) {
#pragma unroll
      for (int k = 0; k < K8; ++k) {
        const int c16 = j + 8 * k;
        if (c16 >= NCH) continue;
        uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
        if (v >= 0) wg_convert16_f16<L>(w[k], srec, c16, lo, hi);
        *reinterpret_cast<uint4*>(tile + wg_swz<T>(e, 2 * c16)) = lo;
        *reinterpret_cast<uint4*>(tile + wg_swz<T>(e, 2 * c16 + 1)) = hi;
      }
    } else {
      wg_convert_entry<L, T, K8, 8, NCH>(w, rec, srec, v >= 0, j, e, tile);
    }
    if constexpr (H) r = bf16x8_to_f16(r);
    *reinterpret_cast<uint4*>(tile + wg_swz<T>(e, L::kRopeChunk + j)) = r;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // tile: generic stores -> wgmma reads
  };

  if (wg == 2) {
    // ---------------- producer ----------------
    // Registers: the producer needs few, the consumers hold 128 fp32 accumulators each (ptxas allocates each
    // role within these limits).
    // The pool is the launch allocation (168 per thread): the consumers' increase must fit in what the
    // producer releases, 128 (168 - 64) >= 256 (216 - 168), or setmaxnreg.inc waits forever (measured: 96 / 200
    // and 112 / 192 run no faster).
    // (H: 96 / 200, the f16 conversion keeps more values live.)
    if constexpr (H) asm volatile("setmaxnreg.dec.sync.aligned.u32 96;\n" ::: "memory");
    else asm volatile("setmaxnreg.dec.sync.aligned.u32 64;\n" ::: "memory");
    const int pw = warp - 8;                // producer warp 0..3
    // Producer warp pw copies entries 8 pw .. 8 pw + 7 of tile ti into ring slot ti % NST (lane = entry; the
    // bulk copy takes uniform operands, so a warp's copies run one after another: 8 per warp, not 32) and
    // arrives on the slot's barrier with its byte count.
    auto issue = [&](int ti) {
      if (ti >= ntiles) return;
      const int slot = ti % NST;
      const int e = 8 * pw + lane;
      const int v = lane < 8 ? sidx[ti * T + e] : -1;
      const uint32_t bytes = __reduce_add_sync(0xffffffffu, v >= 0 ? static_cast<uint32_t>(REC) : 0u);
      if (lane == 0) mbar_arrive_expect_tx(full + slot, bytes);
      __syncwarp();
      if (v >= 0) {
        uint8_t* d = raw + (slot * T + e) * REC;
        const uint8_t* blk = entry_block(p, v);
        const long long off = entry_offset(p, v);
        if constexpr (V4) {
          bulk_g2s(d, blk + off * 576, 576, full + slot);
          // The 8-byte scale record sits in the 16-byte aligned pair starting at (off & ~1) * 8.
          bulk_g2s(d + 576, blk + (576ll << entry_page_shift(p, v)) + (off >> 1) * 16, 16, full + slot);
        } else {
          bulk_g2s(d, blk + off * 656, 656, full + slot);
        }
      }
    };
    for (int s = 0; s < NST - 1; ++s) issue(s);
    // Conversion: 4 threads per entry (e = ptid / 4, j = ptid % 4). Thread j converts the fp8 chunks j + 4 k
    // (16 values each: column block k of the tile for V3.2 / k of the scale groups for V4, so the 4 threads of
    // an entry fill whole 128-byte rows and a warp's 8 entries whole 1024-byte atoms) and copies RoPE chunks
    // j and j + 4. All loads of a thread's batch are issued before any conversion (independent chains).
    const int ptid = tid - 256, e = ptid >> 2, j = ptid & 3;
    constexpr int KCH = NCH / 4;            // fp8 chunks per thread (8 for V3.2, 7 for V4)
    for (int it = 0; it < ntiles; ++it) {
      const int b = it & 1;
      // SC: warpgroup 1 has converted its half of tile it-1 out of the slot about to be refilled.
      if (SC && it >= 1 && it + NST - 1 < ntiles) mbar_wait(raw_free + (it - 1) % NST, ((it - 1) / NST) & 1);
      issue(it + NST - 1);                  // into the slot tile it-1 used (freed by kBarProd below)
      const int v = sidx[it * T + e];
      mbar_wait(full + it % NST, (it / NST) & 1);
      if (it >= 2) bar_sync(kBarFree + b, kWgThreads);   // both consumers are done with tile it-2
      if constexpr (SC) {
        convert_half(it, 0, ptid);
        bar_arrive(kBarFull + b, kWgThreads);
        bar_sync(kBarProd, 128);
        continue;
      }
      const uint8_t* rec = raw + ((it % NST) * T + e) * REC;
      uint8_t* tile = tiles + b * S::kTileBytes;
      if constexpr (!(PROBE & 1)) {
        const uint8_t* srec = V4 ? rec + 8 * (entry_offset(p, v) & 1) : rec;   // V4: this entry's half of the pair
        uint4 w[KCH];
#pragma unroll
        for (int k = 0; k < KCH; ++k)
          w[k] = v >= 0 ? *reinterpret_cast<const uint4*>(rec + (j + 4 * k) * 16) : make_uint4(0, 0, 0, 0);
        uint4 r0 = make_uint4(0, 0, 0, 0), r1 = r0;
        if (v >= 0) {
          r0 = *reinterpret_cast<const uint4*>(rec + L::kRopeRaw + j * 16);
          r1 = *reinterpret_cast<const uint4*>(rec + L::kRopeRaw + (j + 4) * 16);
        }
        if constexpr (H) {
#pragma unroll
          for (int k = 0; k < KCH; ++k) {
            const int c16 = j + 4 * k;
            uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;   // invalid entry: zeros (its raw scale is garbage)
            if (v >= 0) wg_convert16_f16<L>(w[k], srec, c16, lo, hi);
            *reinterpret_cast<uint4*>(tile + wg_swz<T>(e, 2 * c16)) = lo;
            *reinterpret_cast<uint4*>(tile + wg_swz<T>(e, 2 * c16 + 1)) = hi;
          }
        } else {
          wg_convert_entry<L, T, KCH, 4, NCH>(w, rec, srec, v >= 0, j, e, tile);
        }
        if constexpr (H) {
          r0 = bf16x8_to_f16(r0);
          r1 = bf16x8_to_f16(r1);
        }
        *reinterpret_cast<uint4*>(tile + wg_swz<T>(e, L::kRopeChunk + j)) = r0;
        *reinterpret_cast<uint4*>(tile + wg_swz<T>(e, L::kRopeChunk + j + 4)) = r1;
      }
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // tile: generic stores -> wgmma reads
      bar_arrive(kBarFull + b, kWgThreads);
      bar_sync(kBarProd, 128);   // every producer thread is done with ring slot it % NST
    }
    return;
  }

  // ---------------- consumers ----------------
  if constexpr (H) asm volatile("setmaxnreg.inc.sync.aligned.u32 200;\n" ::: "memory");
  else asm volatile("setmaxnreg.inc.sync.aligned.u32 216;\n" ::: "memory");
  const int ctid = tid & 127;             // thread within the warpgroup
  const int r0 = (warp & 3) * 16 + g;     // this thread's head rows r0, r0 + 8 within the block
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const uint32_t q_u = smem_u32(qs), tiles_u = smem_u32(tiles);
  // S to log2 units: sm_scale * log2(e), and (H) 2^-k of the head's Q scaling.
  float srow[2] = {p.scale_log2, p.scale_log2};
  if constexpr (H) {
    srow[0] *= exp2i(-qexp[r0]);
    srow[1] *= exp2i(-qexp[r0 + 8]);
  }
  // SC: warpgroup 1 converts its half of tile x (the raw entries have landed) and hands it over.
  auto wg1_convert = [&](int x) {
    wg1_convert_tile<NST>(x, ntiles, lane, full, raw_free, [&](int y) { convert_half(y, 1, ctid); });
  };
  if constexpr (SC) {
    if (wg == 1) {
      if (ntiles > 0) wg1_convert(0);
      if (ntiles > 1) wg1_convert(1);
    }
  }
  for (int it = 0; it < ntiles; ++it) {
    const int b = it & 1;
    const uint32_t tile_u = tiles_u + b * S::kTileBytes;
    uint4* pq = reinterpret_cast<uint4*>(pbuf + b * S::kPBytes) + 2 * ctid;
    float2* pal = reinterpret_cast<float2*>(pbuf + b * S::kPBytes + 128 * 32) + ctid;
    uint32_t a[2][4];
    float alpha[2];
    if (!SC || wg == 0) bar_sync(kBarFull + b, kWgThreads);   // tile it converted (SC: wg 1 sees it through P)
    if (wg == 0) {
      float s[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) s[i] = 0.f;
      wg_fence();
#pragma unroll
      for (int k = 0; k < (PROBE & 2 ? 0 : DQK / 16); ++k) {
        const uint32_t ko = (k & 3) * 32u;   // k-step within the 128-byte row
        wgmma_qk<H>(s, wg_desc(q_u + (k >> 2) * (64 * 128) + ko, 16, 1024),
                           wg_desc(tile_u + (k >> 2) * (T * 128) + ko, 16, 1024), k);
      }
      wg_commit_wait();
      reg_fence(s);
      // s[4 j + q]: head r0 (q < 2) or r0 + 8, entry 8 j + 2 t + (q & 1).
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const bool ok = sidx[it * T + 8 * j + 2 * t + (q & 1)] >= 0;
          s[4 * j + q] = ok ? s[4 * j + q] * srow[q >> 1] : -INFINITY;
          mx[q >> 1] = fmaxf(mx[q >> 1], s[4 * j + q]);
        }
      float m_use[2];
      wg_row_max_update(mx, m_run, m_use, alpha);
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          s[4 * j + q] = exp2f(s[4 * j + q] - m_use[q >> 1]);
          sum[q >> 1] += s[4 * j + q];
        }
      // The quad's partial sums are combined once at the end (alpha is the same across the quad).
      l_run[0] = l_run[0] * alpha[0] + sum[0];
      l_run[1] = l_run[1] * alpha[1] + sum[1];
      wg_pack_p<H>(a, s);
      if (it >= 2) bar_sync(kBarPFree + b, 256);   // warpgroup 1 has read this buffer's P of tile it-2
      pq[0] = make_uint4(a[0][0], a[0][1], a[0][2], a[0][3]);
      pq[1] = make_uint4(a[1][0], a[1][1], a[1][2], a[1][3]);
      *pal = make_float2(alpha[0], alpha[1]);
      bar_arrive(kBarPFull + b, 256);
    } else {
      bar_sync(kBarPFull + b, 256);
      const uint4 x0 = pq[0], x1 = pq[1];
      const float2 al = *pal;
      if (it + 2 < ntiles) bar_arrive(kBarPFree + b, 256);
      a[0][0] = x0.x; a[0][1] = x0.y; a[0][2] = x0.z; a[0][3] = x0.w;
      a[1][0] = x1.x; a[1][1] = x1.y; a[1][2] = x1.z; a[1][3] = x1.w;
      alpha[0] = al.x;
      alpha[1] = al.y;
    }
    wg_pv_step<H, T, PROBE & 2 ? 0 : 2>(o, a, alpha, tile_u, wg);
    wg_release_tile<SC>(it, ntiles, wg, wg1_convert);
  }

  // Epilogue. Warpgroup 0 completes the sums and hands (m, l) of its rows to warpgroup 1.
  if (wg == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
    fin[ctid] = make_float4(m_run[0], m_run[1], l_run[0], l_run[1]);
    bar_arrive(kBarFin, 256);
  } else {
    bar_sync(kBarFin, 256);
    const float4 f4 = fin[ctid];
    m_run[0] = f4.x; m_run[1] = f4.y; l_run[0] = f4.z; l_run[1] = f4.w;
  }
  wg_write_rows<PAIRS>(p, o, m_run, l_run, row, split, hblk, r0, wg, t, qs + wg * kWgStageBytes);
}

// ---- "wge" kernels (sm_90a, V3.2 fp8): the wg kernels, exact for any fp32 tile scale ----
//
// Why: the wg kernels round e4m3 x scale into one bf16 tile, exact only for power-of-two scales; SGLang writes
// amax/448 scales (relative error 7e-3 instead of the ds kernels' 1.6e-3, NOTES.md "Accuracy on SGLang's
// scales"), and that conversion (~700 instructions per tile per producer warp) is what bounds them. Here the
// producer converts the raw e4m3 bytes to f16 without the scale (cvt.rn.f16x2.e4m3x2: one instruction per two
// values, exact, |value| <= 448), copies the bf16 RoPE dims unchanged into their own 64-dim column block, and
// the entries' fp32 scales s[e, t] (t: 128-dim scale tile) beside the tile. The scales are applied where that is
// exact or fp32:
//   * QK: one fp32 accumulator per scale tile, S_t = Q_t K8_t^T (m64n32k16 f16; Q x 2^k per head as in _h, with
//     max |q| in [2^14, 2^15)), and S_rope (bf16 Q_rope x 2^k against the bf16 RoPE block); S = sum_t s[e, t] S_t
//     + S_rope in fp32, then x sm_scale x log2(e) x 2^-k. Two accumulators are in flight, so the fold of one
//     overlaps the next tile's wgmma;
//   * PV: warpgroup w owns dims 256 w .. 256 w + 255 (scale tiles 2w, 2w + 1): O_t += P'_t V8_t (m64n128k16 per
//     scale tile), P'_t = P x s[:, t] / 2^E_t formed in registers in f16, E_t = the exponent of the largest
//     |s[:, t]| seen so far by the CTA (the ds kernels' _c4 idea), so P' lies in [0, 2); O_t is rescaled by
//     2^(E_old - E_new) together with the softmax's alpha when E_t grows, and multiplied by 2^E_t at the end.
// Range: none on the scales (any finite fp32; E_t is clamped to -126 .. 126, so P' < 4 even then) nor on q (the
// power-of-two rescale) nor on the RoPE dims (bf16 throughout). Rounding: P, s / 2^E and P' to f16 (2^-11
// each) while P x s / 2^E_t >= 2^-14; below that, f16 subnormals: an absolute error <= 2^-25 x 2^E_t x 448 per
// term, i.e. only entries whose scale is more than 2^14 below the largest scale of their tile, and whose weight
// is small besides, lose relative precision.
// Same ring, named barriers, split protocol and outputs as the wg kernels; SC as there (_c2). A separate body
// (not a flag of wg_body) so that the measured wg kernels keep their code until this one is measured.

// PV per scale tile: O_t (64 x 128, fp32) += A B, A (P', f16) from registers, B (V8_t) MN-major from shared memory.
__device__ __forceinline__ void wgmma_m64n128k16_rs_h(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Issues (and commits as one group) the QK wgmmas of scale tile TT of a wge tile: d = Q_TT K8_TT^T over its 128
// dims (8 f16 k-steps), or for TT = 4 the RoPE block (4 bf16 k-steps).
template <int TT>
__device__ __forceinline__ void wge_qk_tile(float (&d)[16], uint32_t q_u, uint32_t tile_u) {
  constexpr int K0 = 8 * TT, NK = TT == 4 ? 4 : 8;
  wg_fence();
#pragma unroll
  for (int k = K0; k < K0 + NK; ++k) {
    const uint32_t ko = (k & 3) * 32u;   // k-step within the 128-byte row of column block k / 4
    const uint64_t da = wg_desc(q_u + (k >> 2) * (64 * 128) + ko, 16, 1024);
    const uint64_t db = wg_desc(tile_u + (k >> 2) * (kWgT * 128) + ko, 16, 1024);
    if constexpr (TT == 4) wgmma_m64n32k16_ss(d, da, db, k - K0);
    else wgmma_m64n32k16_ss_h(d, da, db, k - K0);
  }
  wg_commit();
}

// st += sx x s[e, t] for the thread's S elements: sx[4 j + q] is entry 8 j + 2 tl + (q & 1) (tl = lane & 3);
// scl_t: the tile's scales of scale tile t, one fp32 per entry.
__device__ __forceinline__ void wge_fold(float (&st)[16], const float (&sx)[16], const float* scl_t, int tl) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 s2 = *reinterpret_cast<const float2*>(scl_t + 8 * j + 2 * tl);
    st[4 * j + 0] = fmaf(sx[4 * j + 0], s2.x, st[4 * j + 0]);
    st[4 * j + 1] = fmaf(sx[4 * j + 1], s2.y, st[4 * j + 1]);
    st[4 * j + 2] = fmaf(sx[4 * j + 2], s2.x, st[4 * j + 2]);
    st[4 * j + 3] = fmaf(sx[4 * j + 3], s2.y, st[4 * j + 3]);
  }
}

// The running exponent E of scale tile t after this tile: max(e_run, exponent of the tile's largest |scale|),
// clamped to -126 .. 126 (lane = entry, so the result is uniform over the warp, and over the warpgroup since
// every warp reads the same scales); unchanged for a tile whose scales are all 0 (only invalid entries).
__device__ __forceinline__ int wge_tile_exp(const float* scl_t, int lane, int e_run) {
  const uint32_t m = __reduce_max_sync(0xffffffffu, __float_as_uint(scl_t[lane]) & 0x7fffffffu);
  if (m == 0u) return e_run;
  return max(e_run, min(126, max(-126, static_cast<int>(m >> 23) - 127)));
}

// P' = P x s[e, t] x rs (rs = 2^-E_t) as the A operand (f16) of the two PV k-steps, from P's A operand `a`:
// a[kk][0] / [1] hold entries 16 kk + 2 tl + {0, 1} (heads r0 / r0 + 8), a[kk][2] / [3] those entries + 8.
__device__ __forceinline__ void wge_scale_p(uint32_t (&pt)[2][4], const uint32_t (&a)[2][4], const float* scl_t,
                                            int tl, float rs) {
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    const float2 lo = *reinterpret_cast<const float2*>(scl_t + 16 * kk + 2 * tl);
    const float2 hi = *reinterpret_cast<const float2*>(scl_t + 16 * kk + 8 + 2 * tl);
    const uint32_t rlo = pack_f16(lo.x * rs, lo.y * rs), rhi = pack_f16(hi.x * rs, hi.y * rs);
    pt[kk][0] = hmul2(a[kk][0], rlo);
    pt[kk][1] = hmul2(a[kk][1], rlo);
    pt[kk][2] = hmul2(a[kk][2], rhi);
    pt[kk][3] = hmul2(a[kk][3], rhi);
  }
}

// One V3.2 entry of a wge tile (TPE threads per entry, thread j): the e4m3 chunks j + TPE k -> f16 (no scale),
// the RoPE chunks j + TPE k copied (bf16), and for j < 4 the scale of scale tile j into scl[j][e]; zeros for an
// invalid entry (its raw record is not this entry's: it may hold anything, NaN included).
template <int TPE>
__device__ __forceinline__ void wge_convert(const uint8_t* rec, bool valid, uint8_t* tile, float* scl, int e, int j) {
  constexpr int KC = 32 / TPE, KR = 8 / TPE;   // fp8 chunks (16 values) and RoPE chunks (8 dims) per thread
  uint4 w[KC], r[KR];
#pragma unroll
  for (int k = 0; k < KC; ++k)
    w[k] = valid ? *reinterpret_cast<const uint4*>(rec + (j + TPE * k) * 16) : make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int k = 0; k < KR; ++k)
    r[k] = valid ? *reinterpret_cast<const uint4*>(rec + 528 + (j + TPE * k) * 16) : make_uint4(0, 0, 0, 0);
  if (j < 4) scl[j * kWgT + e] = valid ? *reinterpret_cast<const float*>(rec + 512 + 4 * j) : 0.f;
#pragma unroll
  for (int k = 0; k < KC; ++k) {
    const int c16 = j + TPE * k;
    uint32_t h[8];
    cvt_e4m3x4(w[k].x, h[0], h[1]);
    cvt_e4m3x4(w[k].y, h[2], h[3]);
    cvt_e4m3x4(w[k].z, h[4], h[5]);
    cvt_e4m3x4(w[k].w, h[6], h[7]);
    *reinterpret_cast<uint4*>(tile + wg_swz<kWgT>(e, 2 * c16)) = make_uint4(h[0], h[1], h[2], h[3]);
    *reinterpret_cast<uint4*>(tile + wg_swz<kWgT>(e, 2 * c16 + 1)) = make_uint4(h[4], h[5], h[6], h[7]);
  }
#pragma unroll
  for (int k = 0; k < KR; ++k) *reinterpret_cast<uint4*>(tile + wg_swz<kWgT>(e, 64 + j + TPE * k)) = r[k];
}

template <int NST, bool SC>
__device__ __forceinline__ void wge_body(const MlaParams& p, uint8_t* smem_raw) {
  using S = WgeSmem<NST>;
  constexpr int T = kWgT;
  constexpr int DQK = GeomV32::kDqk;
  constexpr int REC = GeomV32::kRec;
  static_assert(NST >= 2, "the ring needs a slot in flight while one is converted");
  static_assert(DQK == 576 && REC == 656 && GeomV32::kRopeRaw == 528 && GeomV32::kRopeChunk == 64,
                "V3.2 records: 512 e4m3, 4 fp32 scales, 64 bf16 RoPE dims");
  static_assert(S::kTileBytes == 9 * T * 128 && S::kSclBytes == 4 * T * 4, "WgeSmem describes this kernel");
  // Registers per thread after setmaxnreg: the pool is the launch allocation (168 per thread), so the consumers'
  // increase must fit in what the producer releases, or setmaxnreg.inc waits forever (NOTES.md "wg kernels").
  // 88 / 208 (equality, as CUTLASS's 40 / 232): with 64-80 the producer spills (its 8 chunks of 16 values in
  // flight), and with 200 for the consumers (two O halves of 64, three QK accumulators of 16) ptxas serializes
  // the wgmmas for lack of registers (ptxas -v, C7512).
  constexpr int kProdRegs = 88, kConsRegs = 208;
  static_assert(128 * (168 - kProdRegs) >= 256 * (kConsRegs - 168) && kProdRegs % 8 == 0 && kConsRegs % 8 == 0,
                "setmaxnreg: the consumers' registers must come from the producer's");
  const uint32_t base_u = smem_u32(smem_raw);
  uint8_t* smem = smem_raw + (((base_u + 1023u) & ~1023u) - base_u);   // swizzle atoms need 1024 B alignment

  uint8_t* qs = smem + S::kQ;
  uint8_t* tiles = smem + S::kTile;
  float* scls = reinterpret_cast<float*>(smem + S::kScl);
  uint8_t* raw = smem + S::kRaw;
  uint8_t* pbuf = smem + S::kP;
  float4* fin = reinterpret_cast<float4*>(smem + S::kFin);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBar);
  uint64_t* raw_free = full + NST;         // SC: [NST], one arrival per warp of warpgroup 1
  int* sidx = reinterpret_cast<int*>(smem + S::kSidx);

  const int split = blockIdx.x, hblk = blockIdx.y, row = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2;
  const int ntot = p.topk + p.topk_extra;
  const int start = split * p.per_split;
  const int n_local = max(0, min(p.per_split, ntot - start));
  const int ntiles = (n_local + T - 1) / T;

  // Index list, validated once: -1 for invalid entries and the padding up to the last tile's end.
  index_list<kWgThreads>(p, row, start, n_local, ntiles * T, tid, sidx);
  // Per-head power-of-two exponent k that puts max |q| into [2^14, 2^15) (warp w: heads w, w + 12, ...).
  int* qexp = reinterpret_cast<int*>(fin);   // fin is not used before the epilogue
  for (int r = warp; r < 64; r += kWgThreads / 32) {
    const int head = hblk * 64 + r;
    uint32_t m = 0;
    if (head < p.h) {
      const uint4* qh = reinterpret_cast<const uint4*>(p.q + (static_cast<size_t>(row) * p.h + head) * DQK);
      for (int c = lane; c < DQK / 8; c += 32) {
        const uint4 v = __ldg(qh + c);
        const uint32_t x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) m = max(m, max(x[i] & 0x7fffu, (x[i] >> 16) & 0x7fffu));
      }
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) qexp[r] = q_shift(m << 16);
  }
  __syncthreads();
  // Q block (heads past h are zero) x 2^k of its head into the swizzled layout: the NoPE dims in f16 (exact),
  // the RoPE dims (chunks 64..71) in bf16 (exact).
  for (int i = tid; i < 64 * (DQK / 8); i += kWgThreads) {
    const int r = i / (DQK / 8), c = i - r * (DQK / 8);
    const int head = hblk * 64 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (head < p.h)
      v = __ldg(reinterpret_cast<const uint4*>(p.q + (static_cast<size_t>(row) * p.h + head) * DQK) + c);
    const float f = exp2i(qexp[r]);
    const uint32_t x[4] = {v.x, v.y, v.z, v.w};
    uint32_t y[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float lo = __uint_as_float(x[k] << 16) * f, hi = __uint_as_float(x[k] & 0xffff0000u) * f;
      y[k] = c < 64 ? pack_f16(lo, hi) : pack_bf16(lo, hi);
    }
    *reinterpret_cast<uint4*>(qs + wg_swz<64>(r, c)) = make_uint4(y[0], y[1], y[2], y[3]);
  }
  wg_ring_init<NST, SC>(tid, full, raw_free);

  // Converts entries e0 .. e0 + 128 / TPE - 1 of tile x (ring slot x % NST) into tile buffer x & 1 with the 128
  // threads of one warpgroup (ltid), TPE per entry.
  auto convert = [&](int x, int e0, int ltid, auto tpe) {
    constexpr int TPE = decltype(tpe)::value;
    const int e = e0 + ltid / TPE;
    const uint8_t* rec = raw + ((x % NST) * T + e) * REC;
    wge_convert<TPE>(rec, sidx[x * T + e] >= 0, tiles + (x & 1) * S::kTileBytes, scls + (x & 1) * (4 * T), e,
                     ltid % TPE);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");   // tile: generic stores -> wgmma reads
  };
  using Tpe4 = std::integral_constant<int, 4>;   // the producer alone: 4 threads per entry, 32 entries
  using Tpe8 = std::integral_constant<int, 8>;   // SC: each warpgroup 16 entries, 8 threads per entry

  if (wg == 2) {
    // ---------------- producer ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProdRegs) : "memory");
    const int pw = warp - 8;                // producer warp 0..3
      // Producer warp pw copies entries 8 pw .. 8 pw + 7 of tile ti into ring slot ti % NST (lane = entry) and
    // arrives on the slot's barrier with its byte count.
    auto issue = [&](int ti) {
      if (ti >= ntiles) return;
      const int slot = ti % NST;
      const int e = 8 * pw + lane;
      const int v = lane < 8 ? sidx[ti * T + e] : -1;
      const uint32_t bytes = __reduce_add_sync(0xffffffffu, v >= 0 ? static_cast<uint32_t>(REC) : 0u);
      if (lane == 0) mbar_arrive_expect_tx(full + slot, bytes);
      __syncwarp();
      if (v >= 0)
        bulk_g2s(raw + (slot * T + e) * REC, entry_block(p, v) + static_cast<long long>(entry_offset(p, v)) * REC, REC,
                 full + slot);
    };
    for (int s = 0; s < NST - 1; ++s) issue(s);
    const int ptid = tid - 256;
    for (int it = 0; it < ntiles; ++it) {
      const int b = it & 1;
      // SC: warpgroup 1 has converted its half of tile it-1 out of the slot about to be refilled.
      if (SC && it >= 1 && it + NST - 1 < ntiles) mbar_wait(raw_free + (it - 1) % NST, ((it - 1) / NST) & 1);
      issue(it + NST - 1);                  // into the slot tile it-1 used (freed by kBarProd below)
      mbar_wait(full + it % NST, (it / NST) & 1);
      if (it >= 2) bar_sync(kBarFree + b, kWgThreads);   // both consumers are done with tile it-2
      if constexpr (SC) convert(it, 0, ptid, Tpe8{});
      else convert(it, 0, ptid, Tpe4{});
      bar_arrive(kBarFull + b, kWgThreads);
      bar_sync(kBarProd, 128);   // every producer thread is done with ring slot it % NST
    }
    return;
  }

  // ---------------- consumers ----------------
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsRegs) : "memory");
  const int ctid = tid & 127;             // thread within the warpgroup
  const int r0 = (warp & 3) * 16 + g;     // this thread's head rows r0, r0 + 8 within the block
  float o0[64], o1[64];                   // O of scale tiles 2 wg and 2 wg + 1, in units of 2^e_run[0 / 1]
#pragma unroll
  for (int i = 0; i < 64; ++i) o0[i] = o1[i] = 0.f;
  int e_run[2] = {-126, -126};
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const uint32_t q_u = smem_u32(qs), tiles_u = smem_u32(tiles);
  // S to log2 units: sm_scale * log2(e) * 2^-k of the head's Q scaling.
  const float srow[2] = {p.scale_log2 * exp2i(-qexp[r0]), p.scale_log2 * exp2i(-qexp[r0 + 8])};
  // V read MN-major: leading byte offset = between 64-dim column blocks, stride byte offset = between 8-entry
  // groups (as in the wg kernels).
  constexpr uint32_t kVLbo = T * 128u, kVSbo = 1024u;

  // SC: warpgroup 1 converts its half of tile x (the raw entries have landed) and hands it over.
  auto wg1_convert = [&](int x) {
    wg1_convert_tile<NST>(x, ntiles, lane, full, raw_free, [&](int y) { convert(y, 16, ctid, Tpe8{}); });
  };
  if constexpr (SC) {
    if (wg == 1) {
      if (ntiles > 0) wg1_convert(0);
      if (ntiles > 1) wg1_convert(1);
    }
  }
  for (int it = 0; it < ntiles; ++it) {
    const int b = it & 1;
    const uint32_t tile_u = tiles_u + b * S::kTileBytes;
    const float* scl = scls + b * (4 * T);
    uint4* pq = reinterpret_cast<uint4*>(pbuf + b * S::kPBytes) + 2 * ctid;
    float* pal = reinterpret_cast<float*>(pbuf + b * S::kPBytes + 128 * 32);   // alpha per head
    uint32_t a[2][4];
    float alpha[2];
    if (!SC || wg == 0) bar_sync(kBarFull + b, kWgThreads);   // tile it converted (SC: wg 1 sees it through P)
    if (wg == 0) {
      // S = RoPE part + sum_t s[e, t] S_t: the RoPE group first (it initializes st), then the scale tiles
      // alternating between two accumulators, each folded while the next one runs.
      float st[16], sa[16], sb[16];
      wge_qk_tile<4>(st, q_u, tile_u);
      wge_qk_tile<0>(sa, q_u, tile_u);
      wg_wait<1>();
      reg_fence(st);
      wge_qk_tile<1>(sb, q_u, tile_u);
      wg_wait<1>();
      reg_fence(sa);
      wge_fold(st, sa, scl + 0 * T, t);
      wge_qk_tile<2>(sa, q_u, tile_u);
      wg_wait<1>();
      reg_fence(sb);
      wge_fold(st, sb, scl + 1 * T, t);
      wge_qk_tile<3>(sb, q_u, tile_u);
      wg_wait<1>();
      reg_fence(sa);
      wge_fold(st, sa, scl + 2 * T, t);
      wg_wait<0>();
      reg_fence(sb);
      wge_fold(st, sb, scl + 3 * T, t);
      float (&s)[16] = st;
      // s[4 j + q]: head r0 (q < 2) or r0 + 8, entry 8 j + 2 t + (q & 1).
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const bool ok = sidx[it * T + 8 * j + 2 * t + (q & 1)] >= 0;
          s[4 * j + q] = ok ? s[4 * j + q] * srow[q >> 1] : -INFINITY;
          mx[q >> 1] = fmaxf(mx[q >> 1], s[4 * j + q]);
        }
      float m_use[2];
      wg_row_max_update(mx, m_run, m_use, alpha);
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          s[4 * j + q] = exp2f(s[4 * j + q] - m_use[q >> 1]);
          sum[q >> 1] += s[4 * j + q];
        }
      // The quad's partial sums are combined once at the end (alpha is the same across the quad).
      l_run[0] = l_run[0] * alpha[0] + sum[0];
      l_run[1] = l_run[1] * alpha[1] + sum[1];
      wg_pack_p<true>(a, s);   // P <= 1
      if (it >= 2) bar_sync(kBarPFree + b, 256);   // warpgroup 1 has read this buffer's P of tile it-2
      pq[0] = make_uint4(a[0][0], a[0][1], a[0][2], a[0][3]);
      pq[1] = make_uint4(a[1][0], a[1][1], a[1][2], a[1][3]);
      if (t == 0) {
        pal[r0] = alpha[0];
        pal[r0 + 8] = alpha[1];
      }
      bar_arrive(kBarPFull + b, 256);
    } else {
      bar_sync(kBarPFull + b, 256);
      const uint4 x0 = pq[0], x1 = pq[1];
      alpha[0] = pal[r0];
      alpha[1] = pal[r0 + 8];
      if (it + 2 < ntiles) bar_arrive(kBarPFree + b, 256);
      a[0][0] = x0.x; a[0][1] = x0.y; a[0][2] = x0.z; a[0][3] = x0.w;
      a[1][0] = x1.x; a[1][1] = x1.y; a[1][2] = x1.z; a[1][3] = x1.w;
    }
    // P' per owned scale tile (relative to its running 2^E), and the accumulators' rescale: alpha x 2^(E_old - E).
    uint32_t pt[2][2][4];
    float fac[2][2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const float* scl_t = scl + (2 * wg + u) * T;
      const int e_new = wge_tile_exp(scl_t, lane, e_run[u]);
      const float f = exp2i(max(e_run[u] - e_new, -126));
      e_run[u] = e_new;
      fac[u][0] = alpha[0] * f;
      fac[u][1] = alpha[1] * f;
      wge_scale_p(pt[u], a, scl_t, t, exp2i(-e_new));
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      o0[i] *= fac[0][(i >> 1) & 1];
      o1[i] *= fac[1][(i >> 1) & 1];
    }
    // O_t += P'_t V8_t: V = the tile read MN-major, scale tile t = column blocks 2t, 2t + 1 (dims 128 t ..).
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
      wgmma_m64n128k16_rs_h(o0, pt[0][kk], wg_desc(tile_u + (4 * wg) * (T * 128) + kk * 16 * 128, kVLbo, kVSbo));
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
      wgmma_m64n128k16_rs_h(o1, pt[1][kk], wg_desc(tile_u + (4 * wg + 2) * (T * 128) + kk * 16 * 128, kVLbo, kVSbo));
    wg_commit_wait();
    reg_fence(o0);
    reg_fence(o1);
    wg_release_tile<SC>(it, ntiles, wg, wg1_convert);
  }

  // Epilogue. Warpgroup 0 completes the sums and hands (m, l) of its rows to warpgroup 1.
  if (wg == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
      l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
    fin[ctid] = make_float4(m_run[0], m_run[1], l_run[0], l_run[1]);
    bar_arrive(kBarFin, 256);
  } else {
    bar_sync(kBarFin, 256);
    const float4 f4 = fin[ctid];
    m_run[0] = f4.x; m_run[1] = f4.y; l_run[0] = f4.z; l_run[1] = f4.w;
  }
  const float eo[2] = {exp2i(e_run[0]), exp2i(e_run[1])};
  const int d0 = wg * 256 + 2 * t;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int head = hblk * 64 + r0 + 8 * r;
    if (head >= p.h) continue;
    const float l = l_run[r];
    const float lse = row_lse(m_run[r], l);
    const float f = p.splits == 1 ? out_factor(p, head, l, lse) : inv_sum(l);
    const float f0 = f * eo[0], f1 = f * eo[1];
    if (p.splits == 1) {
      __nv_bfloat16* dst = p.out + (static_cast<size_t>(row) * p.h + head) * kDv + d0;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        *reinterpret_cast<uint32_t*>(dst + 8 * j) = pack_bf16(o0[4 * j + 2 * r] * f0, o0[4 * j + 2 * r + 1] * f0);
        *reinterpret_cast<uint32_t*>(dst + 128 + 8 * j) =
            pack_bf16(o1[4 * j + 2 * r] * f1, o1[4 * j + 2 * r + 1] * f1);
      }
      if (wg == 0 && t == 0) p.lse[static_cast<size_t>(row) * p.h + head] = l > 0.f ? lse : INFINITY;
    } else {
      const size_t base = (static_cast<size_t>(row) * p.splits + split) * p.h + head;
      float* dst = p.o_part + base * kDv + d0;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o0[4 * j + 2 * r] * f0, o0[4 * j + 2 * r + 1] * f0);
        *reinterpret_cast<float2*>(dst + 128 + 8 * j) =
            make_float2(o1[4 * j + 2 * r] * f1, o1[4 * j + 2 * r + 1] * f1);
      }
      if (wg == 0 && t == 0) p.lse_part[base] = lse;
    }
  }
}

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
  const int ntot = p.topk + p.topk_extra;
  const int start = split * p.per_split;
  const int n_local = max(0, min(p.per_split, ntot - start));
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
        float sum[2] = {0.f, 0.f};
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          s[i] = exp2f(s[i] - m_use[(i >> 1) & 1]);
          sum[(i >> 1) & 1] += s[i];
        }
        l_run[0] = l_run[0] * alpha[0] + sum[0];
        l_run[1] = l_run[1] * alpha[1] + sum[1];
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
      float sum[2] = {0.f, 0.f};
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        s[i] = exp2f(s[i] - m_use[(i >> 1) & 1]);
        sum[(i >> 1) & 1] += s[i];
      }
      // The quad's partial sums are combined once at the end (alpha is the same across the quad).
      l_run[0] = l_run[0] * alpha[0] + sum[0];
      l_run[1] = l_run[1] * alpha[1] + sum[1];
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
#endif  // sm_90a

// Kernel entry: the wg kernels exist for sm_90a only (the sm_120a build gets a trap; the launcher never
// picks them there).
template <class L, int NST, int PROBE, bool H, bool SC, bool PAIRS = false>
__device__ __forceinline__ void wg_entry(const MlaParams& p, uint8_t* smem) {
#ifdef MLA_HAS_WGMMA
  wg_body<L, NST, PROBE, H, SC, PAIRS>(p, smem);
#else
  __trap();
#endif
}

template <int NST, bool SC>
__device__ __forceinline__ void wge_entry(const MlaParams& p, uint8_t* smem) {
#ifdef MLA_HAS_WGMMA
  wge_body<NST, SC>(p, smem);
#else
  __trap();
#endif
}

template <class L, int TPE, bool PIPE, bool SPLIT, int PROBE, int CLUSTER = 0, bool PAIRS = false>
__device__ __forceinline__ void wgt_entry(const MlaParams& p, uint8_t* smem) {
#ifdef MLA_HAS_WGMMA
  wgt_body<L, TPE, PIPE, SPLIT, PROBE, CLUSTER, PAIRS>(p, smem);
#else
  __trap();
#endif
}

}  // namespace

// The kernels (tables in sparse_mla_decode.h, which kernels/kernel_metadata.cpp also reads).
#define MLA_KERNEL(NAME, LAY, MT, T, G, NST, OPT)                                                          \
  extern "C" __global__ void __launch_bounds__(32 * MT * G * kMlaQkSplit<OPT>, 1)                          \
  NAME(const __grid_constant__ MlaParams p) {                                                              \
    extern __shared__ __align__(128) uint8_t smem[];                                                       \
    griddep_launch_dependents();                                                                           \
    mla_body<Layout##LAY, MT, T, G, NST, OPT>(p, smem);                                                    \
  }
#define DS_KERNEL(NAME, LAY, MT, T, NST, CV)                                                              \
  extern "C" __global__ void __launch_bounds__(kDsThreads, 1) NAME(const __grid_constant__ MlaParams p) { \
    extern __shared__ __align__(128) uint8_t smem[];                                                      \
    griddep_launch_dependents();                                                                          \
    ds_body<Layout##LAY, MT, T, NST, CV>(p, smem);                                                        \
  }
// es kernels (tuning build): at most 128 registers, so that two CTAs share an SM (their shared memory allows it at
// V4 CSA's splits).
#define ES_KERNEL(NAME, LAY, MT, NST)                                                                     \
  extern "C" __global__ void __launch_bounds__(kDsThreads, 2) NAME(const __grid_constant__ MlaParams p) { \
    extern __shared__ __align__(128) uint8_t smem[];                                                      \
    griddep_launch_dependents();                                                                          \
    es_body<Layout##LAY, MT, NST>(p, smem);                                                               \
  }
#define WG_KERNEL(NAME, LAY, NST, PROBE, H, SC)                                                           \
  extern "C" __global__ void __launch_bounds__(kWgThreads, 1) NAME(const __grid_constant__ MlaParams p) { \
    extern __shared__ __align__(128) uint8_t smem[];                                                      \
    griddep_launch_dependents();                                                                          \
    wg_entry<Layout##LAY, NST, PROBE, H, SC>(p, smem);                                                    \
  }

#define WGE_KERNEL(NAME, NST, SC)                                                                         \
  extern "C" __global__ void __launch_bounds__(kWgThreads, 1) NAME(const __grid_constant__ MlaParams p) { \
    extern __shared__ __align__(128) uint8_t smem[];                                                      \
    griddep_launch_dependents();                                                                          \
    wge_entry<NST, SC>(p, smem);                                                                          \
  }

#define WGT_KERNEL(NAME, LAY, TPE, PIPE, SPLIT, PROBE)                                                            \
  extern "C" __global__ void __launch_bounds__(kWgThreads, 1) NAME(const __grid_constant__ MlaParams p) { \
    extern __shared__ __align__(128) uint8_t smem[];                                                      \
    griddep_launch_dependents();                                                                          \
    wgt_entry<Layout##LAY, TPE, PIPE, SPLIT, PROBE>(p, smem);                                             \
  }

SPARSE_MLA_FIRST_KERNELS(MLA_KERNEL)
SPARSE_MLA_DS_KERNELS(DS_KERNEL)
SPARSE_MLA_WG_KERNELS(WG_KERNEL)
// The same kernels with the split-pair merge in their epilogue (wg_write_rows<true>): separate, so that the others
// keep their code as it was (inline, the merge measured 1.05-1.12x on the unfused rows with 4-16 splits).
#define WG_PAIR_KERNEL(NAME, LAY, NST, PROBE, H, SC)                                                      \
  extern "C" __global__ void __launch_bounds__(kWgThreads, 1) NAME(const __grid_constant__ MlaParams p) { \
    extern __shared__ __align__(128) uint8_t smem[];                                                      \
    griddep_launch_dependents();                                                                          \
    wg_entry<Layout##LAY, NST, PROBE, H, SC, true>(p, smem);                                              \
  }
SPARSE_MLA_WG_PAIR_KERNELS(WG_PAIR_KERNEL)
SPARSE_MLA_WGE_KERNELS(WGE_KERNEL)
// wgt kernels in clusters of the two CTAs of 128 heads (grid y = head blocks, so h must give an even number of them).
#define WGTX_KERNEL(NAME, LAY, PROBE, MODE)                                                                        \
  extern "C" __global__ void __cluster_dims__(1, 2, 1) __launch_bounds__(kWgThreads, 1)                            \
      NAME(const __grid_constant__ MlaParams p) {                                                                  \
    extern __shared__ __align__(128) uint8_t smem[];                                                               \
    griddep_launch_dependents();                                                                                   \
    wgt_entry<Layout##LAY, 4, false, false, PROBE, MODE>(p, smem);                                                 \
  }
SPARSE_MLA_WGTX_KERNELS(WGTX_KERNEL)
#define WGTX_PAIR_KERNEL(NAME, LAY, PROBE, MODE)                                                                   \
  extern "C" __global__ void __cluster_dims__(1, 2, 1) __launch_bounds__(kWgThreads, 1)                            \
      NAME(const __grid_constant__ MlaParams p) {                                                                  \
    extern __shared__ __align__(128) uint8_t smem[];                                                               \
    griddep_launch_dependents();                                                                                   \
    wgt_entry<Layout##LAY, 4, false, false, PROBE, MODE, true>(p, smem);                                           \
  }
SPARSE_MLA_WGTX_PAIR_KERNELS(WGTX_PAIR_KERNEL)
// The production _t64c kernels (warpgroup 1 converts half of each tile), with or without the split-pair merge.
#define WGTC_KERNEL(NAME, LAY, PAIRS)                                                                     \
  extern "C" __global__ void __launch_bounds__(kWgThreads, 1) NAME(const __grid_constant__ MlaParams p) { \
    extern __shared__ __align__(128) uint8_t smem[];                                                      \
    griddep_launch_dependents();                                                                          \
    wgt_entry<Layout##LAY, 4, false, true, 0, 0, PAIRS>(p, smem);                                         \
  }
SPARSE_MLA_WGTC_KERNELS(WGTC_KERNEL)
#ifdef PDSERVE_TUNING_PROBES
SPARSE_MLA_FIRST_RETIRED_KERNELS(MLA_KERNEL)  // retired from production: no shape's choice (sparse_mla_decode.h)
SPARSE_MLA_DS_RETIRED_KERNELS(DS_KERNEL)
SPARSE_MLA_WG_RETIRED_KERNELS(WG_KERNEL)
SPARSE_MLA_WG_PAIR_RETIRED_KERNELS(WG_PAIR_KERNEL)
SPARSE_MLA_WGE_RETIRED_KERNELS(WGE_KERNEL)
SPARSE_MLA_FIRST_TUNING_KERNELS(MLA_KERNEL)
SPARSE_MLA_WG_PROBE_KERNELS(WG_KERNEL)
SPARSE_MLA_WGT_KERNELS(WGT_KERNEL)          // experimental (tuning build only)
SPARSE_MLA_WGT_PROBE_KERNELS(WGT_KERNEL)
SPARSE_MLA_WGTX_PROBE_KERNELS(WGTX_KERNEL)
SPARSE_MLA_ES_KERNELS(ES_KERNEL)            // experimental: not faster than the ds kernels
#endif

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
extern "C" __global__ void __launch_bounds__(kCombineThreads) sparse_mla_combine(const __grid_constant__ MlaParams p) {
  combine_body<16>(p);
}
extern "C" __global__ void __launch_bounds__(kCombineThreads) sparse_mla_combine_b8(const __grid_constant__ MlaParams p) {
  combine_body<8>(p);
}
#ifdef PDSERVE_TUNING_PROBES
extern "C" __global__ void __launch_bounds__(kCombineThreads) sparse_mla_combine_tl(const __grid_constant__ MlaParams p) {
  combine_body<16, true>(p);
}
extern "C" __global__ void __launch_bounds__(kCombineThreads)
    sparse_mla_combine_b8_tl(const __grid_constant__ MlaParams p) {
  combine_body<8, true>(p);
}
#endif
