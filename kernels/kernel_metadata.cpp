// Writes the metadata of one kernel module as JSON to stdout: `kernel_metadata dsa_indexer` or
// `kernel_metadata sparse_mla_decode`. build.sh runs it and puts <module>.json next to <module>.fatbin.
//
// It is compiled from the very headers the .cu files instantiate their kernels from, so the launcher reads
// the kernels' names, threads per CTA, dynamic shared memory (fixed bytes + bytes per unit of work) and the
// parameter struct's layout from what the build saw, instead of mirroring them by hand. Plain host C++ (no
// device code): `nvcc -std=c++17 -x c++` builds it in about a second. The output depends on nothing but the
// headers (no paths, times or hashes), so rebuilds are bit-identical like the fatbins.
#include <cstdio>
#include <cstring>

#include "dsa_indexer/dsa_indexer.h"
#include "sparse_mla_decode/sparse_mla_decode.h"
#ifdef PDSERVE_TUNING_PROBES   // the tuning build (kernels/tuning/build.sh) lists its own kernels too
#include "tuning/sparse_mla_decode_tuning.h"
#endif

namespace {

// Emits one JSON object per call, comma-separated, in a fixed order (so the bytes never change).
struct Writer {
  bool first = true;
  void sep() {
    std::printf(first ? "\n" : ",\n");
    first = false;
  }
};

void field(Writer& w, const char* name, size_t offset, size_t size) {
  w.sep();
  std::printf("    {\"name\": \"%s\", \"offset\": %zu, \"size\": %zu}", name, offset, size);
}

// Bytes of shared memory per entry of a sparse MLA CTA's index list (int32 sidx[], from the layouts' kSidx on).
constexpr int kIndexBytes = sizeof(int);

// One kernel: `unit` names what smem_per_unit counts ("entry": entries of the split's index list,
// "chunk_page": pages of a fused scoring CTA's chunk, "": nothing).
void kernel(Writer& w, const char* name, const char* family, int threads, int smem_fixed, int smem_per_unit,
            const char* unit, const char* extra) {
  w.sep();
  std::printf("    {\"name\": \"%s\", \"family\": \"%s\", \"threads\": %d, \"smem_fixed\": %d, "
              "\"smem_per_unit\": %d, \"smem_unit\": \"%s\"%s}",
              name, family, threads, smem_fixed, smem_per_unit, unit, extra);
}

template <class L>
const char* mla_shape(char* buf, size_t n, int heads, int tile, int stages, const char* more) {
  std::snprintf(buf, n, ", \"layout\": \"%s\", \"heads\": %d, \"tile\": %d, \"stages\": %d%s", L::kName, heads,
                tile, stages, more);
  return buf;
}

void sparse_mla_decode() {
  char buf[384], more[256];
  std::printf("{\n  \"module\": \"sparse_mla_decode\",\n  \"params\": {\"struct\": \"MlaParams\", \"size\": %zu, "
              "\"fields\": [", sizeof(MlaParams));
  Writer f;
#define MLA_FIELD(NAME) field(f, #NAME, offsetof(MlaParams, NAME), sizeof(MlaParams::NAME));
  MLA_PARAMS_FIELDS(MLA_FIELD)
#undef MLA_FIELD
  std::printf("\n  ]},\n  \"kernels\": [");
  Writer k;
#define MLA_META_WITH(NAME, LAY, MT, T, G, NST, OPT, EXTRA)                                                  \
  {                                                                                                          \
    using S = MlaSmem<Geom##LAY, MT, T, G, NST, kMlaQkSplit<OPT>>;                                           \
    std::snprintf(more, sizeof more, ", \"groups\": %d, \"opt\": %d" EXTRA, G, OPT);                         \
    kernel(k, #NAME, "mla", S::kThreads, S::kSidx, kIndexBytes, "entry",                                     \
           mla_shape<Geom##LAY>(buf, sizeof buf, 16 * MT, T, NST, more));                                    \
  }
#define MLA_META(NAME, LAY, MT, T, G, NST, OPT) MLA_META_WITH(NAME, LAY, MT, T, G, NST, OPT, "")
  SPARSE_MLA_FIRST_KERNELS(MLA_META)
#define DS_META_WITH(NAME, LAY, MT, T, NST, CV, EXTRA)                                                       \
  {                                                                                                          \
    std::snprintf(more, sizeof more, ", \"cv\": %d" EXTRA, CV);                                              \
    kernel(k, #NAME, "ds", kDsThreads, DsSmem<Geom##LAY, MT, T, NST>::kSidx, kIndexBytes, "entry",           \
           mla_shape<Geom##LAY>(buf, sizeof buf, 16 * MT, T, NST, more));                                    \
  }
#define DS_META(NAME, LAY, MT, T, NST, CV) DS_META_WITH(NAME, LAY, MT, T, NST, CV, "")
  SPARSE_MLA_DS_KERNELS(DS_META)
#define WG_META_(NAME, LAY, NST, PROBE, H, SC, PAIRS, EXTRA)                                                \
  {                                                                                                          \
    std::snprintf(more, sizeof more, ", \"probe\": %d, \"f16\": %s, \"split_convert\": %s, \"exact_scales\": false, " \
                  "\"merges_split_pairs\": %s" EXTRA, PROBE, H ? "true" : "false", SC ? "true" : "false", PAIRS); \
    kernel(k, #NAME, "wg", kWgThreads, WgSmem<Geom##LAY, NST>::kSidx + kWgAlignSlack, kIndexBytes, "entry",  \
           mla_shape<Geom##LAY>(buf, sizeof buf, kWgHeads, kWgT, NST, more));                                \
  }
#define WG_META(NAME, LAY, NST, PROBE, H, SC) WG_META_(NAME, LAY, NST, PROBE, H, SC, "false", "")
#define WG_PAIR_META(NAME, LAY, NST, PROBE, H, SC) WG_META_(NAME, LAY, NST, PROBE, H, SC, "true", "")
  SPARSE_MLA_WG_KERNELS(WG_META)
  SPARSE_MLA_WG_PAIR_KERNELS(WG_PAIR_META)
#define WGE_META_WITH(NAME, NST, SC, EXTRA)                                                                  \
  {                                                                                                         \
    std::snprintf(more, sizeof more, ", \"probe\": 0, \"f16\": true, \"split_convert\": %s, \"exact_scales\": true" \
                  EXTRA, SC ? "true" : "false");                                                            \
    kernel(k, #NAME, "wg", kWgThreads, WgeSmem<NST>::kSidx + kWgAlignSlack, kIndexBytes, "entry",           \
           mla_shape<GeomV32>(buf, sizeof buf, kWgHeads, kWgT, NST, more));                                 \
  }
#define WGE_META(NAME, NST, SC) WGE_META_WITH(NAME, NST, SC, "")
  SPARSE_MLA_WGE_KERNELS(WGE_META)
#define WGTX_META_(NAME, LAY, PROBE, MODE, PAIRS)                                                            \
  {                                                                                                          \
    std::snprintf(more, sizeof more,                                                                         \
                  ", \"probe\": %d, \"f16\": false, \"exact_scales\": false, \"threads_per_entry\": 4, "           \
                  "\"pipelined\": false, \"split_convert\": false, \"cluster_head_blocks\": 2, "                    \
                  "\"cluster_exchange\": \"%s\", \"balanced_consumers\": %s, \"merges_split_pairs\": %s, "          \
                  "\"experimental\": %s", PROBE, MODE >= 2 ? "bulk" : "st.async", MODE == 3 ? "true" : "false",       \
                  PAIRS, MODE != 2 ? "true" : "false");                                                      \
    kernel(k, #NAME, "wg", kWgThreads, WgtSmem<Geom##LAY>::kEnd + kWgAlignSlack, 0, "entry",                 \
           mla_shape<Geom##LAY>(buf, sizeof buf, kWgHeads, kWgtT, 2, more));                                 \
  }
#define WGTX_META(NAME, LAY, PROBE, MODE) WGTX_META_(NAME, LAY, PROBE, MODE, "false")
#define WGTX_PAIR_META(NAME, LAY, PROBE, MODE) WGTX_META_(NAME, LAY, PROBE, MODE, "true")
  SPARSE_MLA_WGTX_KERNELS(WGTX_META)
  SPARSE_MLA_WGTX_PAIR_KERNELS(WGTX_PAIR_META)
#define WGTC_META(NAME, LAY, PAIRS)                                                                          \
  {                                                                                                          \
    std::snprintf(more, sizeof more,                                                                         \
                  ", \"probe\": 0, \"f16\": false, \"exact_scales\": false, \"threads_per_entry\": 4, "             \
                  "\"pipelined\": false, \"split_convert\": true, \"merges_split_pairs\": %s",                      \
                  PAIRS ? "true" : "false");                                                                 \
    kernel(k, #NAME, "wg", kWgThreads, WgtSmem<Geom##LAY>::kEnd + kWgAlignSlack, 0, "entry",                 \
           mla_shape<Geom##LAY>(buf, sizeof buf, kWgHeads, kWgtT, 2, more));                                 \
  }
  SPARSE_MLA_WGTC_KERNELS(WGTC_META)
#ifdef PDSERVE_TUNING_PROBES
  // Retired kernels ("retired": true): correct, but no shape's choice in the launcher's table, so out of production.
#define RETIRED ", \"retired\": true"
#define MLA_RETIRED_META(NAME, LAY, MT, T, G, NST, OPT) MLA_META_WITH(NAME, LAY, MT, T, G, NST, OPT, RETIRED)
#define DS_RETIRED_META(NAME, LAY, MT, T, NST, CV) DS_META_WITH(NAME, LAY, MT, T, NST, CV, RETIRED)
#define WG_RETIRED_META(NAME, LAY, NST, PROBE, H, SC) WG_META_(NAME, LAY, NST, PROBE, H, SC, "false", RETIRED)
#define WG_PAIR_RETIRED_META(NAME, LAY, NST, PROBE, H, SC) WG_META_(NAME, LAY, NST, PROBE, H, SC, "true", RETIRED)
#define WGE_RETIRED_META(NAME, NST, SC) WGE_META_WITH(NAME, NST, SC, RETIRED)
  SPARSE_MLA_FIRST_RETIRED_KERNELS(MLA_RETIRED_META)
  SPARSE_MLA_FIRST_V4B_KERNELS(MLA_RETIRED_META)
  SPARSE_MLA_DS_RETIRED_KERNELS(DS_RETIRED_META)
  SPARSE_MLA_WG_RETIRED_KERNELS(WG_RETIRED_META)
  SPARSE_MLA_WG_PAIR_RETIRED_KERNELS(WG_PAIR_RETIRED_META)
  SPARSE_MLA_WGE_RETIRED_KERNELS(WGE_RETIRED_META)
  SPARSE_MLA_WG_PROBE_KERNELS(WG_META)
  // Experimental kernels ("experimental": true): not (yet) measured faster than what they would replace.
#define WGT_META(NAME, LAY, TPE, PIPE, SPLIT, PROBE)                                                         \
  {                                                                                                          \
    std::snprintf(more, sizeof more,                                                                         \
                  ", \"probe\": %d, \"f16\": false, \"exact_scales\": false, \"threads_per_entry\": %d, "          \
                  "\"pipelined\": %s, \"split_convert\": %s, \"experimental\": true",                              \
                  PROBE, TPE, PIPE ? "true" : "false", SPLIT ? "true" : "false");                            \
    kernel(k, #NAME, "wg", kWgThreads, WgtSmem<Geom##LAY>::kEnd + kWgAlignSlack, 0, "entry",                 \
           mla_shape<Geom##LAY>(buf, sizeof buf, kWgHeads, kWgtT, 2, more));                                 \
  }
  SPARSE_MLA_WGT_KERNELS(WGT_META)
  SPARSE_MLA_WGT_PROBE_KERNELS(WGT_META)
  SPARSE_MLA_WGTX_PROBE_KERNELS(WGTX_META)
#define ES_META(NAME, LAY, MT, NST)                                                                          \
  {                                                                                                          \
    kernel(k, #NAME, "ds", kDsThreads, EsSmem<Geom##LAY, MT, NST>::kSidx, kIndexBytes, "entry",              \
           mla_shape<Geom##LAY>(buf, sizeof buf, 16 * MT, kEsT, NST, ", \"cv\": 0, \"qk_split\": \"entries\", \"experimental\": true"));  \
  }
  SPARSE_MLA_ES_KERNELS(ES_META)
#define MLA_TUNING_META(NAME, LAY, MT, T, G, NST, OPT) \
  MLA_META_WITH(NAME, LAY, MT, T, G, NST, OPT, ", \"experimental\": true")
  SPARSE_MLA_FIRST_TUNING_KERNELS(MLA_TUNING_META)
  for (const char* name : {"sparse_mla_combine_tl", "sparse_mla_combine_b8_tl"})
    kernel(k, name, "combine", kCombineThreads, 0, 0, "", ", \"experimental\": true");
#endif
  kernel(k, "sparse_mla_combine", "combine", kCombineThreads, 0, 0, "", "");
  kernel(k, "sparse_mla_combine_b8", "combine", kCombineThreads, 0, 0, "", "");
  std::printf("\n  ]\n}\n");
}

void dsa_indexer() {
  std::printf("{\n  \"module\": \"dsa_indexer\",\n  \"constants\": {\"heads\": %d, \"dim\": %d, \"page\": %d, "
              "\"select_chunk\": %d, \"bins1\": %d, \"ctr\": %d, \"max_subs\": %d, \"max_chunk_pages\": %d, "
              "\"cluster_max\": %d, \"cluster_subs\": %d},\n",
              kHeads, kDim, kPage, kSelectChunk, kBins1, kCtr, kMaxSubs, kMaxChunkPages, kClusterMax, kClusterSubs);
  std::printf("  \"params\": {\"struct\": \"DsaParams\", \"size\": %zu, \"fields\": [", sizeof(DsaParams));
  Writer f;
#define DSA_FIELD(NAME) field(f, #NAME, offsetof(DsaParams, NAME), sizeof(DsaParams::NAME));
  DSA_PARAMS_FIELDS(DSA_FIELD)
#undef DSA_FIELD
  std::printf("\n  ]},\n  \"kernels\": [");
  Writer k;
  char extra[128];
#define DSA_META(NAME, NN, WGMMA, FUSED, EARLY)                                                              \
  {                                                                                                          \
    std::snprintf(extra, sizeof extra, ", \"next_n\": %d, \"impl\": \"%s\", \"early\": %s", NN,            \
                  WGMMA ? "wgmma" : "mma", EARLY ? "true" : "false");                                        \
    kernel(k, #NAME, FUSED ? "fused" : "score", kScoreThreads,                                               \
           kAlignSlack + ScoreSmem<NN>::kLocal + (EARLY ? ScoreSmem<NN>::kBlockIdBytes : 0),                 \
           FUSED ? ScoreSmem<NN>::kLocalPerPage : 0, FUSED ? "chunk_page" : "", extra);                      \
  }
  DSA_SCORE_KERNELS(DSA_META)
#define DSA_SELECT_META(NAME, EARLY, CLUSTER)                                                                \
  {                                                                                                          \
    std::snprintf(extra, sizeof extra, ", \"early\": %s, \"cluster\": %s", EARLY ? "true" : "false",          \
                  CLUSTER ? "true" : "false");                                                               \
    kernel(k, #NAME, "select", kSelectThreads, CLUSTER ? kSelectClusterSmem : kSelectSmem, 0, "", extra);    \
  }
  DSA_SELECT_KERNELS(DSA_SELECT_META)
  std::printf("\n  ]\n}\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "sparse_mla_decode") == 0) {
    sparse_mla_decode();
  } else if (argc == 2 && std::strcmp(argv[1], "dsa_indexer") == 0) {
    dsa_indexer();
  } else {
    std::fprintf(stderr, "usage: %s dsa_indexer|sparse_mla_decode\n", argv[0]);
    return 2;
  }
  return 0;
}
