// Sparse MLA decode (DeepSeek-V4-Flash and V3.2), sm_90a / sm_120a: the production fatbin's one translation unit.
// It includes the kernel families in the order they were written and instantiates exactly the kernels of the
// tables in sparse_mla_decode.h, which kernels/kernel_metadata.cpp turns into sparse_mla_decode.json:
//   common.cuh   the equations, the cache layouts' device readers, gathers, mma.sync helpers
//   first.cuh    the first-version kernels (mma.sync on a dequantized bf16 tile): bf16 KV, sm_120a
//   ds.cuh       fp8, dequantization inside the MMA operands, warps split the head dimension
//   wgmma.cuh    sm_90a: wgmma primitives and the pieces the wg / wge / wgt bodies share
//   wg.cuh       sm_90a: 64 heads per CTA on wgmma, a bulk-copy ring of 32-entry tiles
//   wge.cuh      sm_90a, V3.2: the wg kernels exact for any fp32 tile scale
//   wgt.cuh      sm_90a: 64-entry tiles gathered through registers; the cluster pair (_t64x) and _t64c
//   combine.cuh  the split combine
// The experimental families, the retired kernels and the probes are built from kernels/tuning/ (its own build).
#include "first.cuh"
#include "ds.cuh"
#include "wgmma.cuh"
#include "wg.cuh"
#include "wge.cuh"
#include "wgt.cuh"

namespace {


// Kernel entry: the wg kernels exist for sm_90a only (the sm_120a build gets a trap; the launcher never
// picks them there).
template <class L, int NST, int PROBE, bool H, bool SC, bool PAIRS = false>
__device__ __forceinline__ void wg_entry(const MlaParams& p, uint8_t* smem) {
#ifdef MLA_HAS_WGMMA
  wg_body<L, NST, PROBE, H, SC, PAIRS>(p, smem);
#else
  __trap();
#endif
}

template <int NST, bool SC>
__device__ __forceinline__ void wge_entry(const MlaParams& p, uint8_t* smem) {
#ifdef MLA_HAS_WGMMA
  wge_body<NST, SC>(p, smem);
#else
  __trap();
#endif
}

template <class L, int TPE, bool PIPE, bool SPLIT, int PROBE, int CLUSTER = 0, bool PAIRS = false>
__device__ __forceinline__ void wgt_entry(const MlaParams& p, uint8_t* smem) {
#ifdef MLA_HAS_WGMMA
  wgt_body<L, TPE, PIPE, SPLIT, PROBE, CLUSTER, PAIRS>(p, smem);
#else
  __trap();
#endif
}
}  // namespace

// The kernels (tables in sparse_mla_decode.h, which kernels/kernel_metadata.cpp also reads). Each is exported by
// MLA_EXPORT(ATTRS, NAME, BODY): NAME, with launch attributes ATTRS, runs BODY(p, smem); it first lets its split
// combine (or any dependent launch) be scheduled (griddep_launch_dependents). BODY is last: its template arguments
// hold commas.
#define MLA_EXPORT(ATTRS, NAME, ...)                                           \
  extern "C" __global__ void ATTRS NAME(const __grid_constant__ MlaParams p) { \
    extern __shared__ __align__(128) uint8_t smem[];                           \
    griddep_launch_dependents();                                               \
    __VA_ARGS__(p, smem);                                                      \
  }
#define MLA_KERNEL(NAME, LAY, MT, T, G, NST, OPT) \
  MLA_EXPORT(__launch_bounds__(32 * MT * G * kMlaQkSplit<OPT>, 1), NAME, mla_body<Layout##LAY, MT, T, G, NST, OPT>)
#define DS_KERNEL(NAME, LAY, MT, T, NST, CV) \
  MLA_EXPORT(__launch_bounds__(kDsThreads, 1), NAME, ds_body<Layout##LAY, MT, T, NST, CV>)
#define WG_KERNEL(NAME, LAY, NST, PROBE, H, SC) \
  MLA_EXPORT(__launch_bounds__(kWgThreads, 1), NAME, wg_entry<Layout##LAY, NST, PROBE, H, SC>)
#define WGE_KERNEL(NAME, NST, SC) MLA_EXPORT(__launch_bounds__(kWgThreads, 1), NAME, wge_entry<NST, SC>)

SPARSE_MLA_FIRST_KERNELS(MLA_KERNEL)
SPARSE_MLA_DS_KERNELS(DS_KERNEL)
SPARSE_MLA_WG_KERNELS(WG_KERNEL)
// The same kernels with the split-pair merge in their epilogue (wg_write_rows<true>): separate, so that the others
// keep their code as it was (inline, the merge measured 1.05-1.12x on the unfused rows with 4-16 splits).
#define WG_PAIR_KERNEL(NAME, LAY, NST, PROBE, H, SC) \
  MLA_EXPORT(__launch_bounds__(kWgThreads, 1), NAME, wg_entry<Layout##LAY, NST, PROBE, H, SC, true>)
SPARSE_MLA_WG_PAIR_KERNELS(WG_PAIR_KERNEL)
SPARSE_MLA_WGE_KERNELS(WGE_KERNEL)
// wgt kernels in clusters of the two CTAs of 128 heads (grid y = head blocks, so h must give an even number of them).
#define WGTX_ATTRS __cluster_dims__(1, 2, 1) __launch_bounds__(kWgThreads, 1)
#define WGTX_KERNEL(NAME, LAY, PROBE, MODE) \
  MLA_EXPORT(WGTX_ATTRS, NAME, wgt_entry<Layout##LAY, 4, false, false, PROBE, MODE>)
SPARSE_MLA_WGTX_KERNELS(WGTX_KERNEL)
#define WGTX_PAIR_KERNEL(NAME, LAY, PROBE, MODE) \
  MLA_EXPORT(WGTX_ATTRS, NAME, wgt_entry<Layout##LAY, 4, false, false, PROBE, MODE, true>)
SPARSE_MLA_WGTX_PAIR_KERNELS(WGTX_PAIR_KERNEL)
// The production _t64c kernels (warpgroup 1 converts half of each tile), with or without the split-pair merge.
#define WGTC_KERNEL(NAME, LAY, PAIRS) \
  MLA_EXPORT(__launch_bounds__(kWgThreads, 1), NAME, wgt_entry<Layout##LAY, 4, false, true, 0, 0, PAIRS>)
SPARSE_MLA_WGTC_KERNELS(WGTC_KERNEL)

// The split combine (the launcher runs it behind a split kernel that does not merge its splits itself).
#include "combine.cuh"
extern "C" __global__ void __launch_bounds__(kCombineThreads) sparse_mla_combine(const __grid_constant__ MlaParams p) {
  combine_body<16>(p);
}
extern "C" __global__ void __launch_bounds__(kCombineThreads) sparse_mla_combine_b8(const __grid_constant__ MlaParams p) {
  combine_body<8>(p);
}
