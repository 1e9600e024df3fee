#pragma once
#include "common.cuh"

namespace {

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

// ds_body's QK of the bf16 RoPE dims for the 8 entries E0 .. E0 + 7 of ring record RT (Q: the RoPE dims'
// fragments [MT][4][4], natural order), scaled by the rows' factors RF, into partial slice SLICE of PART; it reads
// ds_body's MT, REC, ROPE, HB, PS, lane, g and t, and declares acc. A macro rather than a function: inlined, the
// function's array (then the kernel's first local) changes the 32-head kernels' bytes, and the production fatbin's
// are fixed (kernels/build.sh).
#define DS_QK_ROPE8(PART, SLICE, Q, RF, RT, E0)                                                                  \
  float acc[MT][4];                                                                                             \
  _Pragma("unroll") for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;    \
  _Pragma("unroll") for (int s2 = 0; s2 < 2; ++s2) {                                                            \
    uint32_t bb[4];                                                                                             \
    ldsm_x4(bb, RT + (E0 + (lane & 7)) * REC + ROPE + (4 * s2 + (lane >> 3)) * 16);                             \
    _Pragma("unroll") for (int mt = 0; mt < MT; ++mt) {                                                         \
      mma_bf16(acc[mt], Q[mt][2 * s2], bb[0], bb[1]);                                                           \
      mma_bf16(acc[mt], Q[mt][2 * s2 + 1], bb[2], bb[3]);                                                       \
    }                                                                                                           \
  }                                                                                                             \
  _Pragma("unroll") for (int mt = 0; mt < MT; ++mt) {                                                           \
    float* dst = PART + (SLICE * HB + 16 * mt + g) * PS + E0 + 2 * t;                                           \
    *reinterpret_cast<float2*>(dst) = make_float2(acc[mt][0] * RF[mt][0], acc[mt][1] * RF[mt][0]);              \
    *reinterpret_cast<float2*>(dst + 8 * PS) = make_float2(acc[mt][2] * RF[mt][1], acc[mt][3] * RF[mt][1]);     \
  }

// The start of a ds-family kernel body (ds_body; the tuning build's es_body, kernels/tuning/sparse_mla_es.cuh),
// for cache layout L, shared-memory layout S (its kRaw, kQmax, kBar and kSidx), T-entry tiles and NW warps: declares
// the ring (raw), the q maxima (qmax_s), the ring's mbarriers (full) and the index list (sidx) in shared memory; the
// CTA's split, head block and row; the thread's tid, warp, lane and fragment coordinates g, t; the split's entries
// (n_local from start) and tiles; rope_warp (V4: the last warp takes the bf16 RoPE dims) and the row's q (qrow). The
// body declares its family's own buffers after it. A macro rather than a function: the names are the body's locals,
// and the production fatbin's bytes are fixed (kernels/build.sh).
#define DS_CTA_START(L, S, T, NW, V4)                                                                 \
  uint8_t* raw = smem + S::kRaw;                                                                      \
  uint32_t* qmax_s = reinterpret_cast<uint32_t*>(smem + S::kQmax);                                    \
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + S::kBar);                                       \
  int* sidx = reinterpret_cast<int*>(smem + S::kSidx);                                                \
  const int split = blockIdx.x, hblk = blockIdx.y, row = blockIdx.z;                                  \
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;         \
  const int n_local = split_entries(p, split), start = split * p.per_split;                           \
  const int ntiles = (n_local + T - 1) / T;                                                           \
  const bool rope_warp = V4 && warp == NW - 1;                                                        \
  const __nv_bfloat16* qrow = p.q + static_cast<size_t>(row) * p.h * L::kDqk

// A head row's largest |q| over a quad's 64 NoPE dims (ds and es kernels): QRAW[0], QRAW[1] hold this lane's 16 bf16
// of the row (lanes t = 0..3 of the quad the rest); lane t = 0 raises the uint32 at QMAX to it, as fp32 bits (the
// |bf16| bits shifted up), for the f16 rescale of q (q_shift). Declares a, b, w and m.
#define DS_Q_ABSMAX(QRAW, QMAX)                                                                       \
  const uint4 a = QRAW[0], b = QRAW[1];                                                               \
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};                                     \
  uint32_t m = 0;                                                                                     \
  _Pragma("unroll") for (int j = 0; j < 8; ++j)                                                       \
    m = max(m, max(w[j] & 0x7fffu, (w[j] >> 16) & 0x7fffu));                                          \
  m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));                                                     \
  m = max(m, __shfl_xor_sync(0xffffffffu, m, 2));                                                     \
  if (t == 0) atomicMax(QMAX, m << 16)

// The QK B operand of one entry's 16 e4m3 bytes U (ds and es kernels; k permuted so that one 16-byte load feeds
// four k-steps): declares B[4][2], k-step s's two f16x2 registers in B[s].
#define DS_CVT_E4M3X16(U, B)                                                                          \
  uint32_t B[4][2];                                                                                   \
  cvt_e4m3x4(U.x, B[0][0], B[0][1]);                                                                  \
  cvt_e4m3x4(U.y, B[1][0], B[1][1]);                                                                  \
  cvt_e4m3x4(U.z, B[2][0], B[2][1]);                                                                  \
  cvt_e4m3x4(U.w, B[3][0], B[3][1])

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

  DS_CTA_START(L, S, T, NW, V4);   // V4: warp 7 owns the bf16 RoPE dims 448..511
  float* part = reinterpret_cast<float*>(smem + S::kPart);
  uint8_t* ph = smem + S::kPh;
  uint8_t* pb = smem + S::kPb;
  float* alpha_s = reinterpret_cast<float*>(smem + S::kAlpha);
  float* fin_m = reinterpret_cast<float*>(smem + S::kFinM);
  float* fin_l = reinterpret_cast<float*>(smem + S::kFinL);
  const int sbase = warp * 64;   // this warp's 64 fp8 dims (bytes of the record)

  // Q. fp8 warps: rows 16 mt + g (+8), dims sbase + 16 t .. + 16 (bf16), rescaled to f16 below.
  // Fragment order (k permuted): k-step s, k = 2t, 2t+1 <-> dims 16t + 4s + 0, 1; k = 2t+8, 2t+9 <-> + 2, 3.
  // V4 requests it before the index list: Q does not depend on it, and requested after it (as until 2026-12-03) its
  // round trip followed the index list's instead of overlapping it (NOTES.md "Requests that queued behind others").
  // V3.2 requests it after the ring's first requests, as before: held across the index list, Q's registers took V3.2's
  // 16-head kernels from 126 to 136 registers, one CTA per SM fewer at 256 threads.
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
      DS_Q_ABSMAX(qraw[mt][hf], qmax_s + 16 * mt + g + 8 * hf);
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
        DS_CVT_E4M3X16(u, b);
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
        DS_QK_ROPE8(part, 8, qr, rf, rt, 8 * warp);
      }
    } else {
      // V4 RoPE warp: dims 448..511 (bf16) of every entry.
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        DS_QK_ROPE8(part, warp, qa, rf, rt, 8 * j);
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

}  // namespace
