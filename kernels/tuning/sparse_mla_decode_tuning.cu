// The tuning build's sparse_mla_decode (kernels/tuning/build.sh, as sparse_mla_decode_tuning.fatbin; never installed):
// the production translation unit, plus the kernels of sparse_mla_decode_tuning.h: those retired from production
// (V4's bf16-KV kernels among them), the experimental ones (the es family in sparse_mla_es.cuh, the first-version
// _o1/_w16/_tl, the wgt _t64/_t64q/_t64p and V4's _t64c, the cluster pair's st.async and balanced exchanges) and the
// wrong-by-design probes.
#include "../sparse_mla_decode/sparse_mla_decode.cu"
#include "sparse_mla_decode_tuning.h"
#include "sparse_mla_es.cuh"

namespace {
struct LayoutV4B : GeomV4B {};   // bf16 KV has no scales: the geometry is the whole device-side reader
}  // namespace

// es kernels (tuning build): at most 128 registers, so that two CTAs share an SM (their shared memory allows it at
// V4 CSA's splits).
#define ES_KERNEL(NAME, LAY, MT, NST) MLA_EXPORT(__launch_bounds__(kDsThreads, 2), NAME, es_body<Layout##LAY, MT, NST>)
// The wgt kernels without a cluster (experimental and probes; the production _t64c has its own macro).
#define WGT_KERNEL(NAME, LAY, TPE, PIPE, SPLIT, PROBE) \
  MLA_EXPORT(__launch_bounds__(kWgThreads, 1), NAME, wgt_entry<Layout##LAY, TPE, PIPE, SPLIT, PROBE>)

SPARSE_MLA_FIRST_RETIRED_KERNELS(MLA_KERNEL)  // retired from production: no shape's choice (sparse_mla_decode.h)
SPARSE_MLA_FIRST_V4B_KERNELS(MLA_KERNEL)     // retired from production: bf16 V4 KV, which no SGLang call has
SPARSE_MLA_DS_RETIRED_KERNELS(DS_KERNEL)
SPARSE_MLA_WG_RETIRED_KERNELS(WG_KERNEL)
SPARSE_MLA_WG_PAIR_RETIRED_KERNELS(WG_PAIR_KERNEL)
SPARSE_MLA_WGE_RETIRED_KERNELS(WGE_KERNEL)
SPARSE_MLA_FIRST_TUNING_KERNELS(MLA_KERNEL)
SPARSE_MLA_WG_PROBE_KERNELS(WG_KERNEL)
SPARSE_MLA_WGT_KERNELS(WGT_KERNEL)          // experimental (tuning build only)
SPARSE_MLA_WGT_PROBE_KERNELS(WGT_KERNEL)
SPARSE_MLA_WGTX_PROBE_KERNELS(WGTX_KERNEL)
SPARSE_MLA_ES_KERNELS(ES_KERNEL)            // experimental: not faster than the ds kernels

// The split combine with a timeline: entry, past the wait and exit times of each CTA into p.counters
// (kernels/tuning/probe_first_timeline.py).
extern "C" __global__ void __launch_bounds__(kCombineThreads) sparse_mla_combine_tl(const __grid_constant__ MlaParams p) {
  combine_body<16, true>(p);
}
extern "C" __global__ void __launch_bounds__(kCombineThreads)
    sparse_mla_combine_b8_tl(const __grid_constant__ MlaParams p) {
  combine_body<8, true>(p);
}
