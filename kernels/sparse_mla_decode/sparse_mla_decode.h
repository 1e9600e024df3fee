// Host-visible contract of sparse_mla_decode.cu: the parameter struct, the cache layouts' geometry, the
// shared-memory layout of every kernel family and the table of kernels the fatbin exports.
//
// One source for two readers: sparse_mla_decode.cu instantiates its kernels from the tables below, and
// kernels/kernel_metadata.cpp (plain host C++, run by build.sh) writes them to sparse_mla_decode.json next
// to the fatbin, which the Python launcher reads instead of mirroring them. Nothing here is device code, so
// the host compiler alone can read it. Private to one translation unit per program: the anonymous namespace
// keeps the .cu's instantiations exactly as they were when all of this lived in the .cu.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>

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
  int page_shift;             // log2(page) of kv
  int rows;
  int h;
  int topk;
  int topk_extra;
  int splits;
  int per_split;              // entries per split, a multiple of the kernel's tile
  float scale_log2;           // sm_scale * log2(e)
  int page_shift_extra;       // log2(page) of kv_extra: a source may be paged differently (V4: SGLang's window cache
                              // at 256 entries per block with its C4 cache at 64 or its C128 cache at 2)
  int* counters;              // ds kernels, splits > 1: [rows, head blocks] zeroed arrival counters; the last
                              // split CTA of a (row, head block) merges the splits itself (null: the launcher
                              // runs sparse_mla_combine instead). The last CTA resets its counter to 0.
};
// The launcher passes this struct by value through ctypes (sparse_mla_decode._Params); a change here must
// change that mirror too (tests/kernels/test_kernel_metadata.py compares both with the emitted layout).
static_assert(sizeof(MlaParams) == 152 && offsetof(MlaParams, counters) == 144, "MlaParams layout changed");

// The fields the metadata lists, in declaration order (the test checks that ctypes agrees on each).
#define MLA_PARAMS_FIELDS(F)                                                                          \
  F(q) F(kv) F(kv_extra) F(indices) F(indices_extra) F(sinks) F(out) F(lse) F(o_part) F(lse_part)     \
  F(block_stride) F(block_stride_extra) F(num_entries) F(num_entries_extra) F(page_shift) F(rows) F(h) \
  F(topk) F(topk_extra) F(splits) F(per_split) F(scale_log2) F(page_shift_extra) F(counters)

namespace {

constexpr int kDv = 512;

// Cache layouts: bytes per entry in the cache (kTok) and per record in shared memory (kRec), dims of K
// (kDqk). The .cu adds the device-side readers (LayoutV4 : GeomV4, ...).
struct GeomV4 {   // V4-Flash fp8 (FlashMLA MODEL1_FP8Sparse, 584 B per entry in the cache)
  static constexpr const char* kName = "v4";
  static constexpr bool kBf16 = false;
  static constexpr int kDqk = 512, kNope = 448, kRec = 592, kChunks = 37, kTok = 576;
  static constexpr int kRopeRaw = 448;   // RoPE bytes within the record
  static constexpr int kRopeChunk = 56;  // first bf16 16-byte chunk of the RoPE dims in a tile row
};
struct GeomV32 {  // V3.2 fp8 (FlashMLA V32_FP8Sparse, 656 B per entry)
  static constexpr const char* kName = "v32";
  static constexpr bool kBf16 = false;
  static constexpr int kDqk = 576, kNope = 512, kRec = 656, kChunks = 41, kTok = 656;
  static constexpr int kRopeRaw = 528;
  static constexpr int kRopeChunk = 64;
};
// bf16 KV (FlashMLA's bf16 sparse layout): each entry is d_qk contiguous bf16 values, no scales. V4's bf16 layout
// (GeomV4B) is the tuning build's only (sparse_mla_decode_tuning.h): SGLang's V4 cache is FP8.
struct GeomV32B {  // V3.2: 576 dims (512 latent + 64 RoPE), V = the first 512
  static constexpr const char* kName = "v32_bf16";
  static constexpr bool kBf16 = true;
  static constexpr int kDqk = 576, kTok = 1152, kChunks = 72, kRec = kTok;
};

// Warps per (head tile, entry group) of a first-version kernel: 2 with OPT bit 1 (d_qk split in QK), else 1.
template <int OPT>
constexpr int kMlaQkSplit = (OPT & 2) ? 2 : 1;
// Timeline words (uint64) per CTA of a first-version kernel with OPT bit 2 (tuning build), from p.counters on; the
// split combine's timeline kernel writes kCombineTlWords per CTA from word kCombineTlBase on.
enum MlaTlSlot {
  kMlaTlEntryNs = 0,   // globaltimer (ns): comparable across SMs
  kMlaTlEntry,         // clock64 (this SM's cycles) from here to kMlaTlEnd
  kMlaTlIndices,       // the index list landed (and Q requested): the first barrier
  kMlaTlIssued,        // tile 0's gather requested
  kMlaTlLanded,        // tile 0 landed (its wait and barrier)
  kMlaTlConverted,     // tile 0 dequantized (fp8) / the same point (bf16)
  kMlaTlQk,            // QK of tile 0 done in warp 0
  kMlaTlMax,           // the row maxima exchanged (barrier S2)
  kMlaTlSoftmax,       // P and the sums complete (barrier S3)
  kMlaTlPv,            // the loop done (warp 0)
  kMlaTlEnd,           // the epilogue's stores issued (warp 0)
  kMlaTlExitNs,
  kMlaTl = 16
};
constexpr int kCombineTlBase = 4096, kCombineTlWords = 4;   // entry, past griddepcontrol.wait, exit (ns)

// Shared-memory layout of a first-version kernel (bytes): fp8, NST raw-record stages + one bf16 tile; bf16,
// NST bf16 tile stages (the gather writes the tile). Then Q, P, the cross-warp row maxima and sums, with KS = 2
// the warps' partial S (one fp32 per QK accumulator and lane), and 4 B per entry of the split's index list from
// kSidx on.
template <class L, int MT, int T, int G, int NST, int KS = 1>
struct MlaSmem {
  static constexpr int kHB = 16 * MT;
  static constexpr int kRowB = L::kDqk * 2;                          // bf16 tile row bytes
  static constexpr int kRawB = L::kBf16 ? T * kRowB : T * L::kRec;   // bytes per ring stage
  static constexpr int kRaw = 0;
  static constexpr int kTile = kRaw + NST * kRawB;
  static constexpr int kQ = L::kBf16 ? kTile : kTile + T * kRowB;
  static constexpr int kP = kQ + kHB * kRowB;
  static constexpr int kRedMax = kP + kHB * T * 2;
  static constexpr int kRedSum = kRedMax + G * kHB * 4;
  static constexpr int kSx = kRedSum + G * kHB * 4;
  static constexpr int kSidx = kSx + (KS == 1 ? 0 : KS * MT * G * (T / G / 8) * 4 * 32 * 4);
  static constexpr int kThreads = 32 * MT * G * KS;
};

// Shared-memory layout of a ds kernel (bytes).
constexpr int kDsThreads = 256;
template <class L, int MT, int T, int NST>
struct DsSmem {
  static constexpr bool kV4 = L::kDqk == 512;
  static constexpr int kHB = 16 * MT;
  static constexpr int kNpart = kV4 ? 8 : 9;   // partial-S slices (V3.2: 8 fp8 + the RoPE one)
  static constexpr int kPS = T + 8;            // partial-S row stride in floats (conflict-free float2 stores)
  static constexpr int kRaw = 0;
  static constexpr int kPart = kRaw + NST * T * L::kRec;
  static constexpr int kPh = kPart + kNpart * kHB * kPS * 4;
  static constexpr int kPb = kPh + kHB * T * 2;
  static constexpr int kAlpha = kPb + (kV4 ? kHB * T * 2 : 0);
  static constexpr int kFinM = kAlpha + kHB * 4;
  static constexpr int kFinL = kFinM + kHB * 4;
  static constexpr int kQmax = kFinL + kHB * 4;
  static constexpr int kBar = kQmax + kHB * 4;
  static constexpr int kSidx = kBar + ((NST * 8 + 15) / 16) * 16;   // + 4 bytes per entry of the split
};

// Shared-memory layout of a wg kernel (bytes from a 1024-aligned base: the launcher adds kWgAlignSlack).
constexpr int kWgT = 32;        // entries per tile
constexpr int kWgThreads = 384;
constexpr int kWgHeads = 64;    // heads per CTA
constexpr int kWgAlignSlack = 1024;
template <class L, int NST>
struct WgSmem {
  static constexpr int kQ = 0;                                      // bf16 Q [d_qk/64][64 heads][128 B]
  static constexpr int kTileBytes = kWgT * L::kDqk * 2;             // bf16 tile [d_qk/64][T][128 B]
  static constexpr int kTile = kQ + 64 * L::kDqk * 2;               // two tile buffers
  static constexpr int kRaw = kTile + 2 * kTileBytes;               // NST x T raw records
  static constexpr int kP = kRaw + NST * kWgT * L::kRec;            // 2 x (128 x 32 B of P, 128 x float2 alpha)
  static constexpr int kPBytes = 128 * 32 + 128 * 8;
  static constexpr int kFin = kP + 2 * kPBytes;                     // 128 x float4 (m0, m1, l0, l1)
  static constexpr int kBar = kFin + 128 * 16;                      // NST ring mbarriers (full), NST (SC: free)
  static constexpr int kSidx = kBar + ((2 * NST * 8 + 15) / 16) * 16;   // + 4 B per entry of the split
};

// Shared-memory layout of a wge kernel (V3.2 only; from a 1024-aligned base, + kWgAlignSlack): the wg layout with
// the NoPE part of the tile in f16 holding the raw e4m3 values, per tile buffer the entries' fp32 scales
// [4 scale tiles][T], and P handed to warpgroup 1 with one rescale factor per head (not per thread), which keeps
// a 2048-entry index list within 227 KB.
template <int NST>
struct WgeSmem {
  static constexpr int kQ = 0;                          // Q [9][64 heads][128 B]: f16 NoPE, bf16 RoPE, x 2^k per head
  static constexpr int kTileBytes = kWgT * 576 * 2;     // tile [9][T][128 B]: f16 e4m3 values, bf16 RoPE
  static constexpr int kTile = kQ + 64 * 576 * 2;       // two tile buffers
  static constexpr int kSclBytes = 4 * kWgT * 4;        // fp32 scales [4][T] per tile buffer
  static constexpr int kScl = kTile + 2 * kTileBytes;
  static constexpr int kRaw = kScl + 2 * kSclBytes;     // NST x T raw records
  static constexpr int kPBytes = 128 * 32 + 64 * 4;     // per buffer: 128 threads x 32 B of f16 P, 64 x float alpha
  static constexpr int kP = kRaw + NST * kWgT * 656;
  static constexpr int kFin = kP + 2 * kPBytes;         // 128 x float4 (m0, m1, l0, l1)
  static constexpr int kBar = kFin + 128 * 16;          // NST ring mbarriers (full), NST (SC: free)
  static constexpr int kSidx = kBar + ((2 * NST * 8 + 15) / 16) * 16;   // + 4 B per entry of the split
  static_assert(kTile % 1024 == 0 && kTileBytes % 1024 == 0, "tile buffers hold whole 1024-byte swizzle atoms");
  static_assert(kRaw % 16 == 0 && kP % 16 == 0 && kPBytes % 16 == 0, "bulk copies and uint4 P stores");
  static_assert(kSidx + kWgAlignSlack + 4 * 2048 <= 232448, "a V3.2 top-2048 split fits the 227 KB of an H200 CTA");
};

// Shared-memory layout of a wgt kernel (bytes from a 1024-aligned base, + kWgAlignSlack): 64-entry tiles gathered
// through registers, so no raw ring and no index list: Q, two bf16 tiles, one P buffer for warpgroup 1 with the
// per-head rescale factors, the epilogue's (m, l) per head and per tile buffer one validity byte per entry.
constexpr int kWgtT = 64;       // entries per tile
template <class L>
struct WgtSmem {
  static constexpr int kQ = 0;                               // bf16 Q [d_qk/64][64 heads][128 B]
  static constexpr int kTileBytes = kWgtT * L::kDqk * 2;     // bf16 tile [d_qk/64][64 entries][128 B]
  static constexpr int kTile = kQ + 64 * L::kDqk * 2;        // two tile buffers
  static constexpr int kP = kTile + 2 * kTileBytes;          // P: [4 k-steps][128 threads] x 16 B (bf16)
  static constexpr int kAlpha = kP + 4 * 128 * 16;           // 64 floats: per-head rescale of the tile
  static constexpr int kFin = kAlpha + 64 * 4;               // 64 x float2: (m, l) per head
  static constexpr int kValid = kFin + 64 * 8;               // 2 x 64 bytes: entry valid, per tile buffer
  static constexpr int kValid32 = kValid + 2 * kWgtT;        // _t64x: 2 x 64 words (the peer stores 4-byte units)
  static constexpr int kBar = kValid32 + 2 * kWgtT * 4;      // _t64x: mbarriers peer-half ready [2], buffer free [2]
  static constexpr int kEnd = kBar + 4 * 8;
  static_assert(kTile % 1024 == 0 && kTileBytes % 1024 == 0, "tile buffers hold whole 1024-byte swizzle atoms");
  static_assert(kEnd + kWgAlignSlack <= 232448, "fits the 227 KB of an H200 CTA whatever the split length");
};

constexpr int kCombineThreads = 128;

}  // namespace

// ---- The kernels the fatbin exports (each X-macro line is one extern "C" kernel) ----
// Names: sparse_mla_<layout>_h<heads per CTA>_t<tile>; layouts v4 / v32 (fp8), v32b (bf16 KV; V4's bf16 kernels,
// v4b, are in the tuning build only: SGLang's V4 KV pool is FP8, so no serving call could reach them).
// X(NAME, LAYOUT, MT, T, G, NST, OPT): 16*MT heads per CTA, T entries per tile, G warp groups (32*MT*G
// threads, twice that with OPT bit 1), NST ring stages; OPT bit 0 = per-warp gather (the bf16 kernels), 0 = per-item
// gather (fp8); OPT bit 1 = two warps per (head tile, entry group), splitting d_qk in QK (suffix _w16: 16 warps).
#define SPARSE_MLA_FIRST_KERNELS(X)                                                            \
  X(sparse_mla_v4_h16_t64, V4, 1, 64, 8, 3, 0)                                                 \
  X(sparse_mla_v4_h32_t64, V4, 2, 64, 8, 2, 0)                                                 \
  X(sparse_mla_v4_h64_t64, V4, 4, 64, 4, 2, 0)                                                 \
  X(sparse_mla_v4_h16_t32, V4, 1, 32, 4, 2, 0)     /* small smem (sm_120: 99 KB per block) */ \
  X(sparse_mla_v32_h32_t64, V32, 2, 64, 8, 2, 0)                                               \
  X(sparse_mla_v32_h16_t32, V32, 1, 32, 4, 2, 0)   /* small smem (sm_120) */                   \
  X(sparse_mla_v32b_h16_t64, V32B, 1, 64, 8, 2, 1)                                             \
  X(sparse_mla_v32b_h32_t64, V32B, 2, 64, 8, 2, 1)                                             \
  X(sparse_mla_v32b_h64_t32, V32B, 4, 32, 4, 3, 1)                                             \
  X(sparse_mla_v32b_h16_t32, V32B, 1, 32, 4, 2, 1) /* small smem (sm_120) */

// ds kernels (fp8 only; kDsThreads): sparse_mla_ds_<layout>_h<heads per CTA>_t<tile>_s<ring stages>.
// X(NAME, LAYOUT, MT, T, NST, CV); suffix _c4 (CV 4): the entry scale goes into P, relative to a running
// maximum (no f16 range limit on V).
#define SPARSE_MLA_DS_KERNELS(X)                             \
  X(sparse_mla_ds_v4_h16_t64_s2, V4, 1, 64, 2, 0)            \
  X(sparse_mla_ds_v4_h16_t32_s4, V4, 1, 32, 4, 0)            \
  X(sparse_mla_ds_v32_h16_t64_s2, V32, 1, 64, 2, 0)          \
  X(sparse_mla_ds_v32_h16_t32_s4, V32, 1, 32, 4, 0)          \
  X(sparse_mla_ds_v32_h32_t64_s2, V32, 2, 64, 2, 0)

// wg kernels (sm_90a; kWgThreads, 64 heads per CTA, kWgT-entry tiles): sparse_mla_wg_<layout>_s<stages>.
// X(NAME, LAYOUT, NST, PROBE, H, SC): _h (H) f16 tile, _c2 (SC) warpgroup 1 converts half of each tile.
#define SPARSE_MLA_WG_KERNELS(X)                          \
  X(sparse_mla_wg_v4_s3, V4, 3, 0, false, false)          \
  X(sparse_mla_wg_v32_s3_c2, V32, 3, 0, false, true)
// The defaults at 64 heads with their split-pair merge (sparse_mla_wg_<layout>..._m, metadata "merges_split_pairs"):
// the launcher takes them for two splits (fuse_combine), where they replace the combine kernel. V3.2's _c2_m is
// retired: where _c2 runs in two splits, _t64c (its _t64c_m) is the choice.
#define SPARSE_MLA_WG_PAIR_KERNELS(X)                     \
  X(sparse_mla_wg_v4_s3_m, V4, 3, 0, false, false)

// wgt kernels (sm_90a, fp8; kWgThreads, 64 heads per CTA, kWgtT-entry tiles gathered through registers, no ring).
// SPARSE_MLA_WGTX_KERNELS (production): _t64x, a cluster of the two CTAs of 128 heads, each gathering and converting
// half of every tile (into registers, ahead of the free buffer) and copying it in bulk into the peer, one copy per
// producer warp; needs an even number of 64-head blocks.
// X(NAME, LAYOUT, PROBE, MODE).
#define SPARSE_MLA_WGTX_KERNELS(X)                        \
  X(sparse_mla_wg_v4_t64x, V4, 0, 2)                      \
  X(sparse_mla_wg_v32_t64x, V32, 0, 2)
// The cluster pair with the split-pair merge in its epilogue (as the wg kernels' _m): the launcher takes it for two
// splits (h=128 at 32 rows), where it replaces the combine kernel. X(NAME, LAYOUT, PROBE, MODE).
#define SPARSE_MLA_WGTX_PAIR_KERNELS(X)                   \
  X(sparse_mla_wg_v4_t64x_m, V4, 0, 2)                    \
  X(sparse_mla_wg_v32_t64x_m, V32, 0, 2)
// Production _t64c (V3.2; V4's stays in the tuning build): one CTA per 64-head block, warpgroup 1 converting half of
// each tile; _t64c_m with the split-pair merge. X(NAME, LAYOUT, PAIRS).
#define SPARSE_MLA_WGTC_KERNELS(X)                        \
  X(sparse_mla_wg_v32_t64c, V32, false)                   \
  X(sparse_mla_wg_v32_t64c_m, V32, true)

// wge kernels (sm_90a, V3.2 fp8 only; kWgThreads, 64 heads per CTA, kWgT-entry tiles): the wg kernels exact for any
// fp32 tile scale (raw e4m3 in f16, the scales applied to the fp32 partial S and to P): sparse_mla_wg_v32_s<stages>_e.
// X(NAME, NST, SC): _c2 (SC) warpgroup 1 converts half of each tile.
#define SPARSE_MLA_WGE_KERNELS(X)                         \
  X(sparse_mla_wg_v32_s3_e, 3, false)

// The retired kernels, the experimental ones and the probes: kernels/tuning/sparse_mla_decode_tuning.h (the
// tuning build only).
