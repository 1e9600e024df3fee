#pragma once
#include "../sparse_mla_decode/ds.cuh"
#include "sparse_mla_decode_tuning.h"

namespace {

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

  DS_CTA_START(L, S, T, NW, V4);   // as ds_body's (ds.cuh); V4: warp 7's PV owns the bf16 RoPE dims 448..511
  uint4* qf = reinterpret_cast<uint4*>(smem + S::kQf);
  uint4* qr = reinterpret_cast<uint4*>(smem + S::kQr);
  float* sbuf = reinterpret_cast<float*>(smem + S::kS);
  float* scl = reinterpret_cast<float*>(smem + S::kScl);

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
      DS_Q_ABSMAX(qraw[k][hf], qmax_s + 16 * mt + g + 8 * hf);
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
          DS_CVT_E4M3X16(u, b);
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

}  // namespace
