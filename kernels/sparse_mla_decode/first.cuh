// First-version sparse MLA decode kernels (mla_body): warp-level mma.sync (bf16 m16n8k16) on one dequantized
// bf16 tile; the only kernels for bf16 KV and for sm_120a.
#pragma once
#include "common.cuh"

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
namespace {

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
  const int n_local = split_entries(p, split), start = split * p.per_split;
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

}  // namespace
