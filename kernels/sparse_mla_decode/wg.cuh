#pragma once
#include "wgmma.cuh"

namespace {

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
#ifdef MLA_HAS_WGMMA   // wgmma.cuh: sm_90a only
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
  const int n_local = split_entries(p, split), start = split * p.per_split;
  const int ntiles = (n_local + T - 1) / T;

  // Q block (heads past h are zero) requested first (not H: bf16 as stored), so its round trip overlaps the index
  // list's; waited for before the ring's barriers are initialized.
  if constexpr (!H)
    q_block_async<DQK>(p, row, hblk * 64, 64, tid, kWgThreads, [&](int r, int c) { return qs + wg_swz<64>(r, c); });
  // Index list, validated once: -1 for invalid entries and the padding up to the last tile's end.
  index_list<kWgThreads>(p, row, start, n_local, ntiles * T, tid, sidx);
  // H: the per-head exponents that put max |q| into [2^14, 2^15).
  int* qexp = reinterpret_cast<int*>(fin);   // fin is not used before the epilogue
  if constexpr (H) {
    WG_Q_EXPONENTS(p, row, hblk * 64, DQK, qexp);
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
      WG_SOFTMAX_TILE(s, t, sidx, it * T, srow, m_run, alpha, l_run);
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
  WG_ML_HANDOVER(wg, m_run, l_run, fin, ctid)
  wg_write_rows<PAIRS>(p, o, m_run, l_run, row, split, hblk, r0, wg, t, qs + wg * kWgStageBytes);
}
#endif  // MLA_HAS_WGMMA

}  // namespace
