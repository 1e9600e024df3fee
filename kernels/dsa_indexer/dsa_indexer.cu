// DSA lightning indexer with fused exact top-k (DeepSeek V3.2 / V4 sparse attention).
//
// For each decode query token t (row = b * next_n + j) and each key position s < len(t):
//   I[t, s] = k_scale[s] * sum_h w[t, h] * ReLU(q[t, h] . k[s])        (64 heads x 128 dims, fp8 e4m3)
// then the exact top-k positions of I[t, 0:len(t)] as int32 (rows with len <= k: 0..len-1, then -1).
//
// Inputs (all contiguous, device memory):
//   q            fp8 e4m3 [B, next_n, 64, 128]   (q's own scale is folded into the weights, as DeepGEMM)
//   weights      fp32 [B * next_n, 64]
//   kv           uint8 [num_blocks, 64 * 132]    per 64-token block: 64 x 128 fp8 keys, then 64 fp32 scales
//   ctx          int32 [B] (ctx_mode 0) or [B, next_n] (ctx_mode 1)
//                mode 0 follows DeepGEMM's causal rule: token j of request b sees
//                len = ctx[b] - next_n + 1 + j keys (the last query token sees all ctx[b] keys).
//   block_table  int32 [B, max_blocks]; only entries below ceil(max_j len / 64) are dereferenced (the base
//                kernels read no others; the early ones also read, unused, entries up to the plan's bound).
// Outputs: out int32 [B * next_n, topk] (unordered set for rows longer than topk);
//          scores fp32 [B * next_n, len_stride]: the logits, written at s < len only.
//
// Two launches, cost proportional to the actual lengths (CTAs past a row's length exit at once):
//   dsa_score_*: grid (chunks, B). One CTA scores chunk_pages pages of one request for all next_n
//     tokens (keys read once, 6-stage cp.async ring), writes the fp32 scores, and adds a 4096-bin
//     histogram of each score's top 12 order-preserving bits into the row's global histogram.
//   dsa_select: grid (CTAs per row, rows), one wave, launched with programmatic dependent launch.
//     Each CTA finds the threshold bin T1 (count above T1 < k <= count at or above) from the row's
//     histogram while its scores stream in (select_subs x 4096 through a cp.async ring), classifies
//     them, places its outputs with one block scan and one global atomic per counter, writes the
//     positions above T1 straight into the output and those in bin T1 (key, position) to a candidate
//     list. The last CTA of the row resolves the remaining slots exactly on the last 20 bits (two
//     10-bit radix rounds, in shared memory when the candidates fit) and resets the row's histogram
//     and counters, so the workspace stays zero between calls without a memset launch.
// Scores equal to the k-th score bit-for-bit are taken in arbitrary order.
// Small-batch variants of both launches (dsa_score_early_*, dsa_select_early, dsa_select_cluster; chosen per plan
// by the launcher) compute the same thing with fewer dependent global round trips: see score_body and select_body.
//
// sm_90a: wgmma (QGMMA) with keys as the 64-row A operand and q as B, both in 128B-swizzled smem.
// other targets (sm_120a): mma.sync m16n8k32 e4m3 with ldmatrix from the same smem layout.
//
// The sources, one file per kernel family, included in order into this one translation unit, which
// instantiates exactly the kernels of the tables in dsa_indexer.h (kernels/kernel_metadata.cpp turns the same
// tables into dsa_indexer.json):
//   common.cuh   order key, row lengths, cp.async, swizzle, timeline stamps, the tensor-core paths, and the
//                top-k pieces both families use (threshold search, output reservation, the tied-bin resolve)
//   score.cuh    dsa_score_*: the scoring kernels (base, fused single launch, early)
//   select.cuh   dsa_select, dsa_select_early, dsa_select_cluster: the selection kernels
#include "score.cuh"

#define DSA_SCORE_KERNEL(NAME, NN, WGMMA, FUSED, EARLY)                                                  \
  extern "C" __global__ void __launch_bounds__(kScoreThreads) NAME(const __grid_constant__ DsaParams p) { \
    score_body<NN, WGMMA, FUSED, EARLY>(p);                                                             \
  }
DSA_SCORE_KERNELS(DSA_SCORE_KERNEL)

#include "select.cuh"

#define DSA_SELECT_KERNEL(NAME, EARLY, CLUSTER)                                                            \
  extern "C" __global__ void __launch_bounds__(kSelectThreads) NAME(const __grid_constant__ DsaParams p) { \
    select_body<EARLY, CLUSTER>(p);                                                                       \
  }
DSA_SELECT_KERNELS(DSA_SELECT_KERNEL)
