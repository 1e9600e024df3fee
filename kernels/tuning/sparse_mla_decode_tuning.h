// The tuning build's kernel tables (kernels/tuning/build.sh): kernels retired from production, experimental kernels
// and wrong-by-design probes, beside the production tables of sparse_mla_decode.h. kernel_metadata.cpp reads them
// with PDSERVE_TUNING_PROBES defined (metadata "retired", "experimental", "probe"); sparse_mla_decode_tuning.cu
// instantiates them. Never in the production fatbin.
#pragma once
#include "../sparse_mla_decode/sparse_mla_decode.h"

namespace {

// V4-Flash's bf16 KV layout (FlashMLA's bf16 sparse layout: 512 contiguous bf16 dims, 448 NoPE + 64 RoPE, K = V, no
// scales): the tuning build's only, as are its kernels (SPARSE_MLA_FIRST_V4B_KERNELS).
struct GeomV4B {
  static constexpr const char* kName = "v4_bf16";
  static constexpr bool kBf16 = true;
  static constexpr int kDqk = 512, kTok = 1024, kChunks = 64, kRec = kTok;
};

// Shared-memory layout of an es kernel (bytes; kDsThreads, kEsT-entry tiles): NST raw-record stages; Q as the QK
// MMA's A fragments ([MT][64-dim group][k-step][lane] x 16 B: f16 NoPE x 2^k per head, then [MT][k-step][lane]
// bf16 RoPE); per tile buffer (two: one tile's softmax and PV overlap the next tile's QK in other warps) the
// tile's S in log2 units ([heads][kSS], entries permuted so that a thread's PV operands are 16 contiguous floats)
// and the entries' scales ([scale][entry], fp32); the q maxima; the ring barriers; 4 B per entry of the index list.
constexpr int kEsT = 64;
template <class L, int MT, int NST>
struct EsSmem {
  static constexpr bool kV4 = L::kDqk == 512;
  static constexpr int kHB = 16 * MT;
  static constexpr int kGroups = L::kNope / 64;   // 64-dim e4m3 groups: V4 7, V3.2 8
  static constexpr int kScales = kV4 ? 7 : 4;     // scales per entry: one per 64 (V4) / 128 (V3.2) dims
  static constexpr int kSS = kEsT + 8;            // S row stride in floats (conflict-free 16-byte reads)
  static constexpr int kRaw = 0;
  static constexpr int kQf = kRaw + NST * kEsT * L::kRec;
  static constexpr int kQr = kQf + MT * kGroups * 4 * 32 * 16;
  static constexpr int kS = kQr + MT * 4 * 32 * 16;
  static constexpr int kScl = kS + 2 * kHB * kSS * 4;
  static constexpr int kQmax = kScl + 2 * kScales * kEsT * 4;
  static constexpr int kBar = kQmax + kHB * 4;
  static constexpr int kSidx = kBar + ((NST * 8 + 15) / 16) * 16;   // + 4 bytes per entry of the split
  static_assert(kQf % 16 == 0 && kS % 16 == 0 && kBar % 8 == 0, "bulk copies, 16-byte loads, mbarriers");
};

}  // namespace

// First-version kernels of the tuning build only ("experimental"), each measured no faster at one row (NOTES.md "One
// row, and the heads between 16 and 64"; "One row: what its time is not"):
//   _o1: the fp8 kernels with the per-warp gather (OPT 1, as the bf16 kernels gather);
//   _w16: 16 warps, pairs splitting d_qk in QK (OPT bit 1);
//   _tl: the 8-warp kernels with a timeline (OPT bit 2: kMlaTl words of clock64 / globaltimer per CTA into
//        p.counters; kernels/tuning/probe_first_timeline.py).
// Retired from production (issue 38 item 3): kernels the launcher's one kernel table (default_fp8_kernel in
// sparse_mla_decode.py: exact by default, the fastest with the lossy opt-in) chooses for no shape, so nothing in
// serving could reach them. They stay in the tuning build (metadata "retired": true) for A/B runs; each list names
// what replaced it. The first-version V3.2 fp8 kernels at 16 and 64 heads: the ds and wg kernels everywhere.
#define SPARSE_MLA_FIRST_RETIRED_KERNELS(X)                 \
  X(sparse_mla_v32_h16_t64, V32, 1, 64, 8, 2, 0)            \
  X(sparse_mla_v32_h64_t32, V32, 4, 32, 4, 3, 0)

// V4's bf16-KV kernels (first version; retired from production 2026-12-06, issue 38 item 3): the launcher chooses
// them for bf16 V4 KV, but SGLang's V4 KV pool is FP8 only (584 B per entry, asserted by its pool), so no plugin call
// reaches them. Library callers with a bf16 V4 cache load this build (the production launcher says so:
// sparse_mla_decode.layout_refusal).
#define SPARSE_MLA_FIRST_V4B_KERNELS(X)                     \
  X(sparse_mla_v4b_h16_t64, V4B, 1, 64, 8, 3, 1)            \
  X(sparse_mla_v4b_h32_t64, V4B, 2, 64, 8, 2, 1)            \
  X(sparse_mla_v4b_h64_t64, V4B, 4, 64, 4, 2, 1)            \
  X(sparse_mla_v4b_h16_t32, V4B, 1, 32, 4, 2, 1)   /* small smem (sm_120) */

#define SPARSE_MLA_FIRST_TUNING_KERNELS(X)                \
  X(sparse_mla_v4_h16_t64_o1, V4, 1, 64, 8, 3, 1)          \
  X(sparse_mla_v32_h16_t64_o1, V32, 1, 64, 8, 2, 1)        \
  X(sparse_mla_v4_h16_t64_w16, V4, 1, 64, 8, 3, 2)         \
  X(sparse_mla_v32_h16_t64_w16, V32, 1, 64, 8, 2, 2)       \
  X(sparse_mla_v4b_h16_t64_w16, V4B, 1, 64, 8, 3, 3)       \
  X(sparse_mla_v32b_h16_t64_w16, V32B, 1, 64, 8, 2, 3)     \
  X(sparse_mla_v4_h16_t64_tl, V4, 1, 64, 8, 3, 4)          \
  X(sparse_mla_v4b_h16_t64_tl, V4B, 1, 64, 8, 3, 5)

// Retired (see SPARSE_MLA_FIRST_RETIRED_KERNELS): three ring stages (measured equal to two), _c4 (2-5% slower) and
// V4's 32-head block (on sm_90a the wg kernels took 17-63 heads; the fatbin runs on no other GPU with its smem).
#define SPARSE_MLA_DS_RETIRED_KERNELS(X)                     \
  X(sparse_mla_ds_v4_h32_t64_s2, V4, 2, 64, 2, 0)            \
  X(sparse_mla_ds_v4_h16_t64_s3, V4, 1, 64, 3, 0)            \
  X(sparse_mla_ds_v4_h32_t64_s3, V4, 2, 64, 3, 0)            \
  X(sparse_mla_ds_v32_h16_t64_s3, V32, 1, 64, 3, 0)          \
  X(sparse_mla_ds_v4_h16_t64_s3_c4, V4, 1, 64, 3, 4)         \
  X(sparse_mla_ds_v32_h16_t64_s3_c4, V32, 1, 64, 3, 4)       \
  X(sparse_mla_ds_v4_h32_t64_s3_c4, V4, 2, 64, 3, 4)         \
  X(sparse_mla_ds_v32_h32_t64_s3_c4, V32, 2, 64, 3, 4)       \
  X(sparse_mla_ds_v4_h16_t32_s4_c4, V4, 1, 32, 4, 4)         \
  X(sparse_mla_ds_v32_h16_t32_s4_c4, V32, 1, 32, 4, 4)       \
  X(sparse_mla_ds_v32_h32_t64_s3, V32, 2, 64, 3, 0)

// es kernels (fp8 only; kDsThreads, kEsT-entry tiles, family "ds"): sparse_mla_es_<layout>_h<heads>_t64_s<stages>.
// Warps split the tile's entries for QK (each the whole d_qk of 8 entries) and the head dimension for PV, as the
// ds kernels do; one block barrier per tile. Experimental, in the tuning build only: correct on H200 but not faster
// than the ds kernels (NOTES.md "es kernels"). X(NAME, LAYOUT, MT, NST).
#define SPARSE_MLA_ES_KERNELS(X)                             \
  X(sparse_mla_es_v4_h16_t64_s2, V4, 1, 2)                   \
  X(sparse_mla_es_v32_h16_t64_s2, V32, 1, 2)

// Retired (see SPARSE_MLA_FIRST_RETIRED_KERNELS): the plain V3.2 kernel (_c2 took its place), _h (the f16 tile, an
// opt-in that was never the default) and V4's _c2 (0-8% slower than the plain one).
#define SPARSE_MLA_WG_RETIRED_KERNELS(X)                  \
  X(sparse_mla_wg_v32_s3, V32, 3, 0, false, false)        \
  X(sparse_mla_wg_v4_s3_h, V4, 3, 0, true, false)         \
  X(sparse_mla_wg_v32_s3_h, V32, 3, 0, true, false)       \
  X(sparse_mla_wg_v4_s3_c2, V4, 3, 0, false, true)
#define SPARSE_MLA_WG_PAIR_RETIRED_KERNELS(X)             \
  X(sparse_mla_wg_v32_s3_c2_m, V32, 3, 0, false, true)

// wgt kernels (sm_90a, fp8; kWgThreads, 64 heads per CTA, kWgtT-entry tiles gathered through registers, no ring),
// experimental: in the tuning build only until one is measured faster than the wg kernels (NOTES.md "wgt
// kernels"). sparse_mla_wg_<layout>_t64 (2 producer threads per entry), _t64q (4, adjacent lanes: a warp's load
// touches 8 entries), _t64p (as _t64q, the loads of each half-tile issued as soon as its registers are free),
// _t64c (as _t64q, warpgroup 1 converting half of each tile; V3.2's is production, SPARSE_MLA_WGTC_KERNELS).
// X(NAME, LAYOUT, TPE, PIPE, SPLIT, PROBE).
#define SPARSE_MLA_WGT_KERNELS(X)                         \
  X(sparse_mla_wg_v4_t64, V4, 2, false, false, 0)         \
  X(sparse_mla_wg_v32_t64, V32, 2, false, false, 0)       \
  X(sparse_mla_wg_v4_t64q, V4, 4, false, false, 0)        \
  X(sparse_mla_wg_v32_t64q, V32, 4, false, false, 0)      \
  X(sparse_mla_wg_v4_t64p, V4, 4, true, false, 0)         \
  X(sparse_mla_wg_v32_t64p, V32, 4, true, false, 0)       \
  X(sparse_mla_wg_v4_t64c, V4, 4, false, true, 0)

// Retired (see SPARSE_MLA_FIRST_RETIRED_KERNELS): _e_c2, 8% slower than _e (NOTES.md "wge kernels").
#define SPARSE_MLA_WGE_RETIRED_KERNELS(X)                 \
  X(sparse_mla_wg_v32_s3_e_c2, 3, true)

// Tuning probes (PROBE bits: 1 = no conversion, 2 = no wgmma): wrong results by design, so they exist only
// in the tuning build (kernels/tuning/build.sh defines PDSERVE_TUNING_PROBES), never in the production fatbin.
#define SPARSE_MLA_WG_PROBE_KERNELS(X)                    \
  X(sparse_mla_wg_v32_s3_x1, V32, 3, 1, false, false)     \
  X(sparse_mla_wg_v32_s3_x2, V32, 3, 2, false, false)     \
  X(sparse_mla_wg_v32_s3_x3, V32, 3, 3, false, false)
// wgt probes (PROBE bits: 1 = no entry loads, 2 = no conversion, 4 = no wgmma).
#define SPARSE_MLA_WGT_PROBE_KERNELS(X)                   \
  X(sparse_mla_wg_v32_t64_x1, V32, 2, false, false, 1)    \
  X(sparse_mla_wg_v32_t64_x2, V32, 2, false, false, 2)    \
  X(sparse_mla_wg_v32_t64_x4, V32, 2, false, false, 4)    \
  X(sparse_mla_wg_v32_t64_x5, V32, 2, false, false, 5)    \
  X(sparse_mla_wg_v32_t64q_x2, V32, 4, false, false, 2)   \
  X(sparse_mla_wg_v32_t64c_x2, V32, 4, false, true, 2)
// Tuning build: _t64xs, the cluster pair exchanging by 16-byte st.async (the first _t64x, measured in calls 4-7 as
// "_t64x"), and its probes; _t64xb, the bulk exchange with balanced consumers (each warpgroup QK and softmax of half
// the entries, PV of half the dims); _t64x_tl, the production _t64x with its timeline (PROBE 8: right results, the
// stamps in the lse_part buffer). X(NAME, LAYOUT, PROBE, MODE: 1 st.async, 2 bulk, 3 bulk + balanced).
#define SPARSE_MLA_WGTX_PROBE_KERNELS(X)                  \
  X(sparse_mla_wg_v4_t64xs, V4, 0, 1)                     \
  X(sparse_mla_wg_v32_t64xs, V32, 0, 1)                   \
  X(sparse_mla_wg_v4_t64xb, V4, 0, 3)                     \
  X(sparse_mla_wg_v32_t64xb, V32, 0, 3)                   \
  X(sparse_mla_wg_v32_t64xs_x1, V32, 1, 1)                \
  X(sparse_mla_wg_v32_t64xs_x2, V32, 2, 1)                \
  X(sparse_mla_wg_v32_t64xs_x4, V32, 4, 1)                \
  X(sparse_mla_wg_v4_t64x_tl, V4, 8, 2)                   \
  X(sparse_mla_wg_v32_t64x_tl, V32, 8, 2)
