// Host-visible contract of dsa_indexer.cu: constants, the parameter struct, the scoring kernels' shared-memory
// layout and the table of kernels the fatbin exports.
//
// One source for two readers: dsa_indexer.cu instantiates its kernels from the table below, and
// kernels/kernel_metadata.cpp (plain host C++, run by build.sh) writes it to dsa_indexer.json next to the
// fatbin, which the Python launcher reads instead of mirroring it. Nothing here is device code. The anonymous
// namespace keeps the .cu's constants exactly as they were when they lived there.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector_types.h>

namespace {

constexpr int kHeads = 64;
constexpr int kDim = 128;
constexpr int kPage = 64;
constexpr int kTileBytes = kPage * kDim;           // 8192 key bytes per page
constexpr int kBlockBytes = kPage * (kDim + 4);    // 8448 bytes per page in the cache
constexpr int kStages = 6;                         // page buffers per CTA (5 pages in flight)
constexpr int kScoreThreads = 128;                 // one warpgroup
constexpr int kSelectThreads = 256;
constexpr int kSelectChunk = 4096;                 // scores per select CTA
constexpr int kBins1 = 4096;                       // top 12 bits
constexpr int kBins2 = 1024;                       // next 10 bits
constexpr int kBins3 = 1024;                       // last 10 bits
constexpr int kCtr = 8;                            // ints per row in DsaParams::ctr
constexpr int kMaxSubs = 16;                       // 4096-score sub-chunks per select CTA, at most
constexpr int kSelectRing = 3;                     // sub-chunks of scores in flight per select CTA
constexpr int kResolveCap = kSelectRing * kSelectChunk / 2;   // candidates the ring's smem holds as uint2
constexpr int kMaxChunkPages = 1023;               // a scoring CTA's histogram counters are 16-bit
static_assert(kMaxChunkPages * kPage <= 65535, "16-bit histogram counters must not overflow");

// Dynamic shared memory of a scoring CTA (bytes from a 1024-aligned base; the launch adds kAlignSlack):
// q tile, key pages, their scales, NN 16-bit histograms (two bins per word), then for the fused kernels
// this CTA's own fp32 scores (kLocalPerPage bytes per page of its chunk), for the EARLY kernels instead the
// block ids of the chunk's first kScoreThreads pages (kBlockIdBytes).
constexpr int kAlignSlack = 1024;
template <int NN>
struct ScoreSmem {
  static constexpr int kQ = 0;
  static constexpr int kKeys = kQ + NN * kTileBytes;
  static constexpr int kScales = kKeys + kStages * kTileBytes;
  static constexpr int kHist = kScales + kStages * kPage * 4;
  static constexpr int kLocal = kHist + NN * kBins1 / 2 * 4;
  static constexpr int kLocalPerPage = NN * kPage * 4;
  static constexpr int kBlockIds = kLocal;
  static constexpr int kBlockIdBytes = kScoreThreads * 4;
};
// dsa_select's dynamic shared memory: kSelectRing sub-chunks of fp32 scores.
constexpr int kSelectSmem = kSelectRing * kSelectChunk * 4;
// dsa_select_cluster: one thread-block cluster per row (kClusterMax CTAs at most; above 8 a non-portable size the
// launcher opts in to), each CTA keeping its <= kClusterSubs sub-chunks of scores; rank 0 also holds the row's tied
// candidates (kClusterCand, more go to the global list) and its 64-bit reservation counter. Rows up to
// kClusterMax x kClusterSubs x 4096 = 128K positions.
constexpr int kClusterMax = 16;
constexpr int kClusterSubs = 2;
constexpr int kClusterCand = 4096;
constexpr int kClusterCandOffset = kClusterSubs * kSelectChunk * 4;
constexpr int kClusterCounterOffset = kClusterCandOffset + kClusterCand * 8;
constexpr int kSelectClusterSmem = kClusterCounterOffset + 8;
static_assert(kClusterSubs <= kSelectRing, "a cluster CTA's sub-chunks all stay in the ring");
static_assert(kClusterCounterOffset >= kResolveCap * 8, "the overflow resolve reuses the ring and the candidates");

}  // namespace

struct DsaParams {
  const uint8_t* q;
  const float* weights;
  const uint8_t* kv;
  const int* ctx;
  const int* block_table;
  float* scores;     // [rows, len_stride]
  uint2* cand;       // [rows, len_stride] (key bits, position)
  int* ghist;        // [rows, 4096], zero between calls
  int* ctr;          // [rows, 8]: sure count, candidate count, select CTAs done; zero between calls
  int* out;          // [rows, topk]
  int batch;
  int next_n;
  int ctx_mode;
  int max_blocks;
  int topk;
  int chunk_pages;
  int len_stride;    // multiple of kSelectChunk, >= every length
  int select_subs;   // 4096-score sub-chunks per select CTA, 1..kMaxSubs
};
// The launcher passes this struct by value through ctypes (dsa_indexer._Params); a change here must change
// that mirror too (tests/kernels/test_kernel_metadata.py compares both with the emitted layout).
static_assert(sizeof(DsaParams) == 112 && offsetof(DsaParams, select_subs) == 108, "DsaParams layout changed");

#define DSA_PARAMS_FIELDS(F)                                                                        \
  F(q) F(weights) F(kv) F(ctx) F(block_table) F(scores) F(cand) F(ghist) F(ctr) F(out) F(batch)     \
  F(next_n) F(ctx_mode) F(max_blocks) F(topk) F(chunk_pages) F(len_stride) F(select_subs)

// ---- The kernels the fatbin exports ----
// Scoring: X(NAME, NN, WGMMA, FUSED, EARLY): NN query tokens per request (next_n), wgmma (sm_90a) or mma.sync;
// FUSED: single launch (scoring + selection) for grids that fit on the GPU at once (see fused_select);
// EARLY: the small-batch variant (score_body: the chunk's block-table entries are read in the same round trip as
// the lengths, and the first kStages pages are requested at once instead of kStages - 1; past them both keep
// kStages - 1 ahead). All kScoreThreads threads per CTA.
#define DSA_SCORE_KERNELS(X)                        \
  X(dsa_score_wgmma_n1, 1, true, false, false)      \
  X(dsa_score_wgmma_n2, 2, true, false, false)      \
  X(dsa_score_mma_n1, 1, false, false, false)       \
  X(dsa_score_mma_n2, 2, false, false, false)       \
  X(dsa_fused_wgmma_n1, 1, true, true, false)       \
  X(dsa_fused_wgmma_n2, 2, true, true, false)       \
  X(dsa_fused_mma_n1, 1, false, true, false)        \
  X(dsa_fused_mma_n2, 2, false, true, false)        \
  X(dsa_score_early_wgmma_n1, 1, true, false, true) \
  X(dsa_score_early_wgmma_n2, 2, true, false, true) \
  X(dsa_score_early_mma_n1, 1, false, false, true)  \
  X(dsa_score_early_mma_n2, 2, false, false, true)

// Selection, the split path's second launch: X(NAME, EARLY, CLUSTER), kSelectThreads threads, kSelectSmem bytes
// (CLUSTER: kSelectClusterSmem). EARLY: the small-batch variant (fewer dependent global round trips; see
// select_body). CLUSTER: EARLY with the row's CTAs in one cluster, which reserve output space, hand over tied
// candidates and find the last CTA through distributed shared memory instead of global atomics.
#define DSA_SELECT_KERNELS(X)      \
  X(dsa_select, false, false)      \
  X(dsa_select_early, true, false) \
  X(dsa_select_cluster, true, true)
