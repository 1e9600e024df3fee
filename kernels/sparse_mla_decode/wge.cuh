#pragma once
#include "wgmma.cuh"

namespace {

#ifdef MLA_HAS_WGMMA   // wgmma.cuh: sm_90a only
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
  const int n_local = split_entries(p, split), start = split * p.per_split;
  const int ntiles = (n_local + T - 1) / T;

  // Index list, validated once: -1 for invalid entries and the padding up to the last tile's end.
  index_list<kWgThreads>(p, row, start, n_local, ntiles * T, tid, sidx);
  // The per-head exponents that put max |q| into [2^14, 2^15).
  int* qexp = reinterpret_cast<int*>(fin);   // fin is not used before the epilogue
  WG_Q_EXPONENTS(p, row, hblk * 64, DQK, qexp);
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
      WG_SOFTMAX_TILE(s, t, sidx, it * T, srow, m_run, alpha, l_run);
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
  WG_ML_HANDOVER(wg, m_run, l_run, fin, ctid)
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
#endif  // MLA_HAS_WGMMA

}  // namespace
