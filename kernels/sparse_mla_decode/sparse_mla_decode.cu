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

struct MlaParams {
  const __nv_bfloat16* q;     // [rows, h, d_qk]
  const uint8_t* kv;          // main cache
  const uint8_t* kv_extra;    // extra cache (may equal kv; unused when topk_extra == 0)
  const int* indices;         // [rows, topk]
  const int* indices_extra;   // [rows, topk_extra]
  const float* sinks;         // [h] or null
  __nv_bfloat16* out;         // [rows, h, 512]
  float* lse;                 // [rows, h]
  float* o_part;              // [rows, splits, h, 512] (splits > 1)
  float* lse_part;            // [rows, splits, h]      (splits > 1)
  long long block_stride;     // bytes between blocks of kv
  long long block_stride_extra;
  int num_entries;            // blocks * page of kv (indices at or beyond are treated as invalid)
  int num_entries_extra;
  int page_shift;             // log2(page)
  int rows;
  int h;
  int topk;
  int topk_extra;
  int splits;
  int per_split;              // entries per split, a multiple of the kernel's tile
  float scale_log2;           // sm_scale * log2(e)
};

namespace {

constexpr int kDv = 512;
constexpr int kExtraBit = 1 << 30;   // marks an index of the extra source in the CTA's index list

struct LayoutV4 {
  static constexpr bool kBf16 = false;
  static constexpr int kDqk = 512, kNope = 448, kRec = 592, kChunks = 37, kTok = 576;
  static constexpr int kRopeRaw = 448;   // RoPE bytes within the record
  static constexpr int kRopeChunk = 56;  // first bf16 16-byte chunk of the RoPE dims in a tile row
  __device__ static const uint8_t* src(const uint8_t* blk, int off, int page_shift, int c) {
    // chunks 0..35: the 576 data bytes; chunk 36: the 8 scale bytes (after the block's data).
    return c < 36 ? blk + off * kTok + c * 16 : blk + (kTok << page_shift) + off * 8;
  }
  __device__ static float scale(const uint8_t* rec, int c16) {   // c16: 16-dim chunk of the NoPE part
    const uint32_t e = rec[576 + (c16 >> 2)];                   // UE8M0: 2^(e - 127)
    return __uint_as_float(e << 23);
  }
  // scale * 2^112 as bf16 bits when that is exact and normal (e <= 142), else `ok` = false.
  __device__ static uint32_t scale_bf16_112(const uint8_t* rec, int c16, bool& ok) {
    const uint32_t e = rec[576 + (c16 >> 2)];
    ok = e <= 142u;
    return (e + 112u) << 7;
  }
};

struct LayoutV32 {
  static constexpr bool kBf16 = false;
  static constexpr int kDqk = 576, kNope = 512, kRec = 656, kChunks = 41, kTok = 656;
  static constexpr int kRopeRaw = 528;
  static constexpr int kRopeChunk = 64;
  __device__ static const uint8_t* src(const uint8_t* blk, int off, int, int c) {
    return blk + off * kTok + c * 16;
  }
  __device__ static float scale(const uint8_t* rec, int c16) {
    return *reinterpret_cast<const float*>(rec + 512 + 4 * (c16 >> 3));
  }
  __device__ static uint32_t scale_bf16_112(const uint8_t* rec, int c16, bool& ok) {
    const uint32_t b = __float_as_uint(scale(rec, c16) * 0x1p112f);
    ok = (b & 0xffffu) == 0 && ((b >> 23) & 0xffu) - 1u < 254u;   // exact in bf16, normal, finite
    return b >> 16;
  }
};

// bf16 KV (FlashMLA's bf16 sparse layout): each entry is d_qk contiguous bf16 values, no scales.
struct LayoutV4B {   // V4-Flash: 512 dims (448 NoPE + 64 RoPE), K = V
  static constexpr bool kBf16 = true;
  static constexpr int kDqk = 512, kTok = 1024, kChunks = 64, kRec = kTok;
};
struct LayoutV32B {  // V3.2: 576 dims (512 latent + 64 RoPE), V = the first 512
  static constexpr bool kBf16 = true;
  static constexpr int kDqk = 576, kTok = 1152, kChunks = 72, kRec = kTok;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
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
}  // namespace

namespace mla_detail {
// Two e4m3 (low byte first) times a power-of-two scale, as bf16x2: exact unless the product leaves
// bf16's normal range.
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint32_t two, float sc) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<__half2*>(&h));
  __nv_bfloat162 v = __floats2bfloat162_rn(f.x * sc, f.y * sc);
  return *reinterpret_cast<uint32_t*>(&v);
}
}  // namespace mla_detail

// The fp32 path for one 16-value chunk, out of line (rare: keeps the fast loop's registers down). Outside
// the anonymous namespace: a non-inlined function there gets a name hashed from the source path, which
// breaks bit-identical rebuilds across directories.
__device__ __noinline__ void pdserve_mla_dequant16_slow(uint4 w, float sc, uint4& lo, uint4& hi) {
  lo.x = mla_detail::fp8x2_to_bf16x2(w.x & 0xffff, sc);
  lo.y = mla_detail::fp8x2_to_bf16x2(w.x >> 16, sc);
  lo.z = mla_detail::fp8x2_to_bf16x2(w.y & 0xffff, sc);
  lo.w = mla_detail::fp8x2_to_bf16x2(w.y >> 16, sc);
  hi.x = mla_detail::fp8x2_to_bf16x2(w.z & 0xffff, sc);
  hi.y = mla_detail::fp8x2_to_bf16x2(w.z >> 16, sc);
  hi.z = mla_detail::fp8x2_to_bf16x2(w.w & 0xffff, sc);
  hi.w = mla_detail::fp8x2_to_bf16x2(w.w >> 16, sc);
}


namespace {
using mla_detail::fp8x2_to_bf16x2;

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

// Dequantize one fp8 tile: raw records -> bf16 [T x d_qk] (swizzled); rows of invalid or past-the-end
// entries zeroed.
template <class L, int T, int NTHR, int ROWB, int OPT>
__device__ __forceinline__ void dequant(const uint8_t* rb, uint8_t* tile, const int* sidx, int j0, int n_local,
                                        int tid, int warp, int lane) {
  constexpr int NCH = L::kNope / 16;   // 16-dim fp8 chunks per entry
  if constexpr (!(OPT & 2)) {
    for (int i = tid; i < T * NCH; i += NTHR) {
      const int e = i / NCH, c = i - e * NCH;
      const int j = j0 + e;
      uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
      if (j < n_local && sidx[j] >= 0) {
        const uint8_t* rec = rb + e * L::kRec;
        const uint4 w = *reinterpret_cast<const uint4*>(rec + c * 16);
        const float sc = L::scale(rec, c);
        lo.x = fp8x2_to_bf16x2(w.x & 0xffff, sc);
        lo.y = fp8x2_to_bf16x2(w.x >> 16, sc);
        lo.z = fp8x2_to_bf16x2(w.y & 0xffff, sc);
        lo.w = fp8x2_to_bf16x2(w.y >> 16, sc);
        hi.x = fp8x2_to_bf16x2(w.z & 0xffff, sc);
        hi.y = fp8x2_to_bf16x2(w.z >> 16, sc);
        hi.z = fp8x2_to_bf16x2(w.w & 0xffff, sc);
        hi.w = fp8x2_to_bf16x2(w.w >> 16, sc);
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
  } else {
    // One entry per warp iteration; lane c < NCH converts fp8 chunk c, the next 8 lanes copy the RoPE chunks.
    constexpr int NW = NTHR / 32;
    for (int e = warp; e < T; e += NW) {
      const int j = j0 + e;
      const bool ok = j < n_local && sidx[j] >= 0;   // uniform across the warp
      const uint8_t* rec = rb + e * L::kRec;
#pragma unroll
      for (int c = lane; c < NCH + 8; c += 32) {
        if (c < NCH) {
          uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
          if (ok) {
            const uint4 w = *reinterpret_cast<const uint4*>(rec + c * 16);
            bool fast;
            const uint32_t sb = L::scale_bf16_112(rec, c, fast);
            if (fast) {
              const uint32_t s2 = sb | (sb << 16);
              lo.x = fp8x2_to_bf16x2_fast(w.x & 0xffff, s2);
              lo.y = fp8x2_to_bf16x2_fast(w.x >> 16, s2);
              lo.z = fp8x2_to_bf16x2_fast(w.y & 0xffff, s2);
              lo.w = fp8x2_to_bf16x2_fast(w.y >> 16, s2);
              hi.x = fp8x2_to_bf16x2_fast(w.z & 0xffff, s2);
              hi.y = fp8x2_to_bf16x2_fast(w.z >> 16, s2);
              hi.z = fp8x2_to_bf16x2_fast(w.w & 0xffff, s2);
              hi.w = fp8x2_to_bf16x2_fast(w.w >> 16, s2);
            } else {   // a scale outside bf16's exact range (never in practice): the fp32 path
              pdserve_mla_dequant16_slow(w, L::scale(rec, c), lo, hi);
            }
          }
          *reinterpret_cast<uint4*>(tile + swz<ROWB>(e, 2 * c)) = lo;
          *reinterpret_cast<uint4*>(tile + swz<ROWB>(e, 2 * c + 1)) = hi;
        } else {
          const int rc = c - NCH;
          uint4 v = make_uint4(0, 0, 0, 0);
          if (ok) v = *reinterpret_cast<const uint4*>(rec + L::kRopeRaw + rc * 16);
          *reinterpret_cast<uint4*>(tile + swz<ROWB>(e, L::kRopeChunk + rc)) = v;
        }
      }
    }
  }
}

// OPT (fp8 layouts), a bit mask: 0 = first version (gather and dequant loops over (entry, chunk) items,
// index decoded per item); bit 0 = per-warp gather (one entry per warp iteration, its index and source
// addresses computed once, lanes = chunks); bit 1 = per-warp dequant with the 5-instruction conversion.
// Kernel suffixes: "" = 0, "_og" = 1, "_od" = 2, "_o1" = 3. bf16 layouts always use the per-warp gather.
template <class L, int MT, int T, int G, int NST, int OPT>
__device__ __forceinline__ void mla_body(const MlaParams& p, uint8_t* smem) {
  constexpr int HB = 16 * MT;           // heads per CTA
  constexpr int NW = MT * G;            // warps
  constexpr int NTHR = NW * 32;
  constexpr int EPW = T / G;            // entries per warp in QK
  constexpr int NTQ = EPW / 8;          // QK n-tiles per warp
  constexpr int DPW = kDv / G;          // output dims per warp in PV
  constexpr int NTV = DPW / 8;          // PV n-tiles per warp
  constexpr int ROWB = L::kDqk * 2;     // bf16 tile row bytes
  constexpr bool BF = L::kBf16;
  static_assert(NTQ == 1 || NTQ == 2, "a QK warp covers 8 or 16 entries");
  static_assert(NTV % 2 == 0 && T % 16 == 0, "tile shape");
  // fp8: NST raw-record stages + one bf16 tile; bf16: NST bf16 tile stages (the gather writes the tile).
  constexpr int RAWB = BF ? T * ROWB : T * L::kRec;   // bytes per ring stage

  uint8_t* raw = smem;
  uint8_t* tile = raw + NST * RAWB;
  uint8_t* qs = BF ? tile : tile + T * ROWB;
  uint8_t* ps = qs + HB * ROWB;
  float* red_max = reinterpret_cast<float*>(ps + HB * T * 2);
  float* red_sum = red_max + G * HB;
  int* sidx = reinterpret_cast<int*>(red_sum + G * HB);

  const int split = blockIdx.x, hblk = blockIdx.y, row = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int mt = warp % MT, grp = warp / MT;
  const int ntot = p.topk + p.topk_extra;
  const int start = split * p.per_split;
  const int n_local = max(0, min(p.per_split, ntot - start));
  const int ntiles = (n_local + T - 1) / T;

  // This CTA's indices, validated once: -1 for invalid, kExtraBit set for the extra source.
  for (int j = tid; j < n_local; j += NTHR) {
    const int pos = start + j;
    int v;
    if (pos < p.topk) {
      const int i = __ldg(p.indices + static_cast<size_t>(row) * p.topk + pos);
      v = (i >= 0 && i < p.num_entries) ? i : -1;
    } else {
      const int i = __ldg(p.indices_extra + static_cast<size_t>(row) * p.topk_extra + (pos - p.topk));
      v = (i >= 0 && i < p.num_entries_extra) ? (i | kExtraBit) : -1;
    }
    sidx[j] = v;
  }
  __syncthreads();

  const int page_mask = (1 << p.page_shift) - 1;
  // Block base of a validated index.
  auto block_of = [&](int v) -> const uint8_t* {
    const bool extra = v & kExtraBit;
    const int idx = v & (kExtraBit - 1);
    return (extra ? p.kv_extra : p.kv) +
           static_cast<long long>(idx >> p.page_shift) * (extra ? p.block_stride_extra : p.block_stride);
  };
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
          const uint8_t* s = L::src(block_of(v), v & page_mask, p.page_shift, c);
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
            src = block_of(v) + static_cast<long long>(v & page_mask) * L::kTok;
            sz = 16;
          }
#pragma unroll
          for (int c = lane; c < L::kChunks; c += 32)
            cp_async16_zfill(dst0 + swz<ROWB>(e, c), src + (sz ? c * 16 : 0), sz);
        } else {
          if (v < 0) continue;
          const uint8_t* blk = block_of(v);
          const int off = v & page_mask;
          uint8_t* d = dst0 + e * L::kRec;
#pragma unroll
          for (int c = lane; c < L::kChunks; c += 32) {
            const uint8_t* s = L::src(blk, off, p.page_shift, c);
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

  // Q block to smem (rows past h are zero).
  for (int i = tid; i < HB * (L::kDqk / 8); i += NTHR) {
    const int r = i / (L::kDqk / 8), c = i - r * (L::kDqk / 8);
    const int head = hblk * HB + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (head < p.h)
      v = __ldg(reinterpret_cast<const uint4*>(p.q + (static_cast<size_t>(row) * p.h + head) * L::kDqk) + c);
    *reinterpret_cast<uint4*>(qs + swz<ROWB>(r, c)) = v;
  }

  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float oacc[NTV][4];
#pragma unroll
  for (int n = 0; n < NTV; ++n) oacc[n][0] = oacc[n][1] = oacc[n][2] = oacc[n][3] = 0.f;

  const int e0 = grp * EPW;
  const int d0 = grp * DPW;
  const int qrow = mt * 16 + g;   // this thread's first head row within the block (second: +8)

  for (int it = 0; it < ntiles; ++it) {
    const uint8_t* kt;   // this tile's bf16 [T x d_qk] (swizzled)
    if constexpr (BF) {
      cp_async_wait<NST - 2>();
      __syncthreads();   // S0: tile `it` landed; every warp is done with tile it-1 (its ring slot is reused next)
      issue(it + NST - 1);
      kt = raw + (it % NST) * RAWB;
    } else {
      issue(it + NST - 1);   // into the buffer tile it-1 used; every thread passed its dequant (S1)
      cp_async_wait<NST - 1>();
      __syncthreads();   // S0: tile `it` landed; the previous PV is done with the bf16 tile
      kt = tile;
      dequant<L, T, NTHR, ROWB, OPT>(raw + (it % NST) * RAWB, tile, sidx, it * T, n_local, tid, warp, lane);
      __syncthreads();   // S1: bf16 tile complete; raw buffer free
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
    static_assert((L::kDqk / 16) % 4 == 0, "k-steps come in fours");
#pragma unroll 1
    for (int ks = 0; ks < L::kDqk / 16; ks += 4) {
      qk_step(ks, 0);
      qk_step(ks + 2, 2);
    }
    float s[NTQ][4];
#pragma unroll
    for (int n = 0; n < NTQ; ++n)
#pragma unroll
      for (int q = 0; q < 4; ++q) s[n][q] = (s4[0][n][q] + s4[1][n][q]) + (s4[2][n][q] + s4[3][n][q]);

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
    if (t == 0) {
      red_max[grp * HB + qrow] = mx[0];
      red_max[grp * HB + qrow + 8] = mx[1];
    }
    __syncthreads();   // S2

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
    if (t == 0) {
      red_sum[grp * HB + qrow] = sum[0];
      red_sum[grp * HB + qrow + 8] = sum[1];
    }
    __syncthreads();   // S3: P and the partial sums are complete

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

  // Epilogue: this thread holds heads qrow, qrow + 8 at dims d0 + 8n + 2t, +1.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int head = hblk * HB + qrow + 8 * r;
    if (head >= p.h) continue;
    const float l = l_run[r];
    const float lse = l > 0.f ? (m_run[r] + log2f(l)) * 0.69314718055994531f : -INFINITY;
    if (p.splits == 1) {
      float f = 0.f;
      if (l > 0.f) {
        f = 1.f / l;
        if (p.sinks) f *= 1.f / (1.f + expf(p.sinks[head] - lse));
      }
      __nv_bfloat16* o = p.out + (static_cast<size_t>(row) * p.h + head) * kDv + d0 + 2 * t;
#pragma unroll
      for (int n = 0; n < NTV; ++n)
        *reinterpret_cast<uint32_t*>(o + 8 * n) = pack_bf16(oacc[n][2 * r] * f, oacc[n][2 * r + 1] * f);
      if (grp == 0 && t == 0) p.lse[static_cast<size_t>(row) * p.h + head] = l > 0.f ? lse : INFINITY;
    } else {
      const float f = l > 0.f ? 1.f / l : 0.f;
      const size_t base = (static_cast<size_t>(row) * p.splits + split) * p.h + head;
      float* o = p.o_part + base * kDv + d0 + 2 * t;
#pragma unroll
      for (int n = 0; n < NTV; ++n)
        *reinterpret_cast<float2*>(o + 8 * n) = make_float2(oacc[n][2 * r] * f, oacc[n][2 * r + 1] * f);
      if (grp == 0 && t == 0) p.lse_part[base] = lse;
    }
  }
}

}  // namespace

// Kernel names: sparse_mla_<layout>_h<heads per CTA>_t<tile>[_o<OPT>]. Threads = 32 * MT * G.
// Layouts: v4 / v32 (fp8), v4b / v32b (bf16 KV).
#define MLA_KERNEL(NAME, LAYOUT, MT, T, G, NST, OPT)                                                \
  extern "C" __global__ void __launch_bounds__(32 * MT * G, 1) NAME(const __grid_constant__ MlaParams p) { \
    extern __shared__ __align__(128) uint8_t smem[];                                                \
    mla_body<LAYOUT, MT, T, G, NST, OPT>(p, smem);                                                  \
  }

MLA_KERNEL(sparse_mla_v4_h16_t64, LayoutV4, 1, 64, 8, 3, 0)
MLA_KERNEL(sparse_mla_v4_h32_t64, LayoutV4, 2, 64, 8, 2, 0)
MLA_KERNEL(sparse_mla_v4_h64_t64, LayoutV4, 4, 64, 4, 2, 0)
MLA_KERNEL(sparse_mla_v4_h16_t32, LayoutV4, 1, 32, 4, 2, 0)     // small smem (sm_120: 99 KB per block)
MLA_KERNEL(sparse_mla_v32_h16_t64, LayoutV32, 1, 64, 8, 2, 0)
MLA_KERNEL(sparse_mla_v32_h32_t64, LayoutV32, 2, 64, 8, 2, 0)
MLA_KERNEL(sparse_mla_v32_h64_t32, LayoutV32, 4, 32, 4, 3, 0)
MLA_KERNEL(sparse_mla_v32_h16_t32, LayoutV32, 1, 32, 4, 2, 0)   // small smem (sm_120)
// _o1 (OPT 3): per-warp gather and dequant, 5-instruction conversion.
MLA_KERNEL(sparse_mla_v4_h16_t64_o1, LayoutV4, 1, 64, 8, 3, 3)
MLA_KERNEL(sparse_mla_v4_h32_t64_o1, LayoutV4, 2, 64, 8, 2, 3)
MLA_KERNEL(sparse_mla_v4_h64_t64_o1, LayoutV4, 4, 64, 4, 2, 3)
MLA_KERNEL(sparse_mla_v4_h16_t32_o1, LayoutV4, 1, 32, 4, 2, 3)
MLA_KERNEL(sparse_mla_v32_h16_t64_o1, LayoutV32, 1, 64, 8, 2, 3)
MLA_KERNEL(sparse_mla_v32_h32_t64_o1, LayoutV32, 2, 64, 8, 2, 3)
MLA_KERNEL(sparse_mla_v32_h64_t32_o1, LayoutV32, 4, 32, 4, 3, 3)
MLA_KERNEL(sparse_mla_v32_h16_t32_o1, LayoutV32, 1, 32, 4, 2, 3)
// The two halves of _o1 alone (which one cost the time), 16-head 64-entry shapes only.
MLA_KERNEL(sparse_mla_v4_h16_t64_og, LayoutV4, 1, 64, 8, 3, 1)
MLA_KERNEL(sparse_mla_v4_h16_t64_od, LayoutV4, 1, 64, 8, 3, 2)
MLA_KERNEL(sparse_mla_v32_h16_t64_og, LayoutV32, 1, 64, 8, 2, 1)
MLA_KERNEL(sparse_mla_v32_h16_t64_od, LayoutV32, 1, 64, 8, 2, 2)
// bf16 KV: NST stages of the bf16 tile itself.
MLA_KERNEL(sparse_mla_v4b_h16_t64, LayoutV4B, 1, 64, 8, 3, 1)
MLA_KERNEL(sparse_mla_v4b_h32_t64, LayoutV4B, 2, 64, 8, 2, 1)
MLA_KERNEL(sparse_mla_v4b_h64_t64, LayoutV4B, 4, 64, 4, 2, 1)
MLA_KERNEL(sparse_mla_v4b_h16_t32, LayoutV4B, 1, 32, 4, 2, 1)    // small smem (sm_120)
MLA_KERNEL(sparse_mla_v32b_h16_t64, LayoutV32B, 1, 64, 8, 2, 1)
MLA_KERNEL(sparse_mla_v32b_h32_t64, LayoutV32B, 2, 64, 8, 2, 1)
MLA_KERNEL(sparse_mla_v32b_h64_t32, LayoutV32B, 4, 32, 4, 3, 1)
MLA_KERNEL(sparse_mla_v32b_h16_t32, LayoutV32B, 1, 32, 4, 2, 1)  // small smem (sm_120)

// Merge the splits of one (row, head): lse = log sum_s exp(lse_s); o = sum_s exp(lse_s - lse) o_s,
// times the sink factor; lse = +inf and o = 0 when no split saw a valid entry. grid (h, rows), 128 threads.
extern "C" __global__ void __launch_bounds__(128) sparse_mla_combine(const __grid_constant__ MlaParams p) {
  const int head = blockIdx.x, row = blockIdx.y, tid = threadIdx.x;
  const size_t base = static_cast<size_t>(row) * p.splits * p.h + head;
  float m = -INFINITY;
  for (int s = 0; s < p.splits; ++s) m = fmaxf(m, p.lse_part[base + static_cast<size_t>(s) * p.h]);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float lse = INFINITY, f = 0.f;
  if (m != -INFINITY) {
    float wsum = 0.f;
    for (int s = 0; s < p.splits; ++s) {
      const size_t b = base + static_cast<size_t>(s) * p.h;
      const float w = expf(p.lse_part[b] - m);   // 0 for an empty split (lse -inf)
      wsum += w;
      if (w > 0.f) {
        const float4 o = reinterpret_cast<const float4*>(p.o_part + b * kDv)[tid];
        acc.x += w * o.x;
        acc.y += w * o.y;
        acc.z += w * o.z;
        acc.w += w * o.w;
      }
    }
    lse = m + logf(wsum);
    f = 1.f / wsum;
    if (p.sinks) f *= 1.f / (1.f + expf(p.sinks[head] - lse));
  }
  uint2 v;
  v.x = pack_bf16(acc.x * f, acc.y * f);
  v.y = pack_bf16(acc.z * f, acc.w * f);
  reinterpret_cast<uint2*>(p.out + (static_cast<size_t>(row) * p.h + head) * kDv)[tid] = v;
  if (tid == 0) p.lse[static_cast<size_t>(row) * p.h + head] = lse;
}
