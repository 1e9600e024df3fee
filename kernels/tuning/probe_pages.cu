// Stand-alone probe (no torch): how fast one wave of CTAs brings the DSA indexer's key pages into shared memory at
// one row, the way dsa_score_early_wgmma_n1 does at B=1 L=128K (342 CTAs x 6 pages of 64 keys x 128 B + 256 B of
// scales, 17.3 MB, ~68.6 KB of shared memory per CTA so three CTAs per SM), against the same pages by bulk copies.
// Each CTA first loads its pages' block ids (the kernel's first round trip), then requests every page at once and
// waits for all of them; timed as the benchmark times a call (L2 evicted, ~1 ms of device sleep, CUDA events; median
// of --reps, the variants round-robin). Whether the per-thread 16-byte requests are what holds the scoring kernel at
// ~1.6 TB/s is what tells a TMA rewrite of its page loads (NOTES.md "Requests that queued behind others") worth it.
//   ids:   the block ids only (the method's cost + one round trip)
//   async: cp.async 16 B, four per thread per page plus 16 threads for the scales (the scoring kernel's loads)
//   bulk:  cp.async.bulk, one thread issuing an 8192 B and a 256 B copy per page onto one mbarrier
// Build: nvcc -std=c++17 -O3 -arch=sm_90a -cudart static kernels/tuning/probe_pages.cu -o kernels/build/probe/probe_pages
// Run:   kernels/build/probe/probe_pages [reps=60] [ctas=342] [pages=6]
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "probe_common.cuh"

constexpr int kThreads = 128, kPageKeys = 8192, kScaleBytes = 256, kBlock = kPageKeys + kScaleBytes, kMaxPages = 8;
constexpr int kSmem = 68608;   // the scoring kernel's dynamic shared memory at 6 pages: three CTAs per SM

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

enum Mode { kIds = 0, kAsync = 1, kBulk = 2 };

template <int MODE>
__global__ void __launch_bounds__(kThreads) gather(const uint8_t* pool, const int* table, int pages, int* sink) {
  extern __shared__ __align__(1024) uint8_t sm[];
  __shared__ int ids[kMaxPages];
  __shared__ __align__(8) uint64_t bar;
  const int tid = threadIdx.x;
  if (tid < pages) ids[tid] = table[blockIdx.x * pages + tid];
  if (MODE == kBulk && tid == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(&bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (MODE == kAsync) {
    for (int p = 0; p < pages; ++p) {
      const uint8_t* blk = pool + static_cast<size_t>(ids[p]) * kBlock;
      const uint32_t dst = smem_u32(sm + p * kBlock);
#pragma unroll
      for (int u = 0; u < 4; ++u) cp_async16(dst + (tid + u * kThreads) * 16, blk + (tid + u * kThreads) * 16);
      if (tid < 16) cp_async16(dst + kPageKeys + tid * 16, blk + kPageKeys + tid * 16);
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
  } else if (MODE == kBulk) {
    const uint32_t b = smem_u32(&bar);
    if (tid == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(pages * kBlock)
                   : "memory");
      for (int p = 0; p < pages; ++p) {
        const uint8_t* blk = pool + static_cast<size_t>(ids[p]) * kBlock;
        const uint32_t dst = smem_u32(sm + p * kBlock);
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                     ::"r"(dst), "l"(blk), "r"(kPageKeys), "r"(b) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                     ::"r"(dst + kPageKeys), "l"(blk + kPageKeys), "r"(kScaleBytes), "r"(b) : "memory");
      }
    }
    uint32_t done = 0;
    while (!done) {
      asm volatile("{\n.reg .pred P;\nmbarrier.try_wait.parity.shared::cta.b64 P, [%1], 0;\nselp.u32 %0, 1, 0, P;\n}\n"
                   : "=r"(done) : "r"(b) : "memory");
    }
  }
  // A word of every page per thread, so that no copy can be dropped.
  int acc = 0;
  if (MODE != kIds)
    for (int p = 0; p < pages; ++p) acc ^= reinterpret_cast<const int*>(sm + p * kBlock)[tid];
  if (acc == 0x12345678) *sink = acc;
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 60;
  const int ctas = argc > 2 ? std::atoi(argv[2]) : 342;
  const int pages = argc > 3 ? std::atoi(argv[3]) : 6;
  if (pages < 1 || pages > kMaxPages || pages * kBlock > kSmem) {
    std::fprintf(stderr, "pages must be 1..%d (at most %d bytes of shared memory), got %d\n", kMaxPages, kSmem, pages);
    return 2;
  }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t flush_bytes = 512u << 20;
  const int pool_blocks = 1 << 15;   // 277 MB of pages: the rows' blocks scattered over more than L2
  uint4* flush;
  uint8_t* pool;
  int *table, *sink;
  CK(cudaMalloc(&flush, flush_bytes));
  CK(cudaMemset(flush, 1, flush_bytes));
  CK(cudaMalloc(&pool, static_cast<size_t>(pool_blocks) * kBlock));
  CK(cudaMemset(pool, 3, static_cast<size_t>(pool_blocks) * kBlock));
  CK(cudaMalloc(&sink, sizeof(int)));
  std::vector<int> ids(pool_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  if (ctas * pages > pool_blocks) {
    std::fprintf(stderr, "ctas x pages must be at most %d\n", pool_blocks);
    return 2;
  }
  CK(cudaMalloc(&table, sizeof(int) * ctas * pages));
  CK(cudaMemcpy(table, ids.data(), sizeof(int) * ctas * pages, cudaMemcpyHostToDevice));
  for (auto k : {gather<kIds>, gather<kAsync>, gather<kBulk>})
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  int sms = 0, clock_khz = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const long long sleep_cycles = static_cast<long long>(clock_khz);   // ~1 ms

  struct Variant {
    std::string name;
    void (*kernel)(const uint8_t*, const int*, int, int*);
  };
  const std::vector<Variant> vars = {{"ids", gather<kIds>}, {"async", gather<kAsync>}, {"bulk", gather<kBulk>}};
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (const auto& v : vars) v.kernel<<<ctas, kThreads, kSmem, st>>>(pool, table, pages, sink);
  CK(cudaStreamSynchronize(st));
  CK(cudaGetLastError());
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const double mb = 1e-6 * ctas * pages * kBlock;
  std::printf("device %s, %d SMs; %d CTAs x %d pages of %d B (%.1f MB), %d B of shared memory per CTA, %d reps\n",
              prop.name, sms, ctas, pages, kBlock, mb, kSmem, reps);
  std::printf("| loads | median us | p10 | p90 | GB/s at the median |\n|---|---|---|---|---|\n");
  std::vector<std::vector<float>> t(vars.size());
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < vars.size(); ++i) {
      flush_kernel<<<sms * 4, 512, 0, st>>>(flush, flush_bytes / 16, sink);
      sleep_kernel<<<1, 1, 0, st>>>(sleep_cycles);
      CK(cudaEventRecord(e0, st));
      vars[i].kernel<<<ctas, kThreads, kSmem, st>>>(pool, table, pages, sink);
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms = 0.f;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      t[i].push_back(ms * 1e3f);
    }
  for (size_t i = 0; i < vars.size(); ++i) {
    auto v = t[i];
    std::sort(v.begin(), v.end());
    const float med = v[v.size() / 2];
    std::printf("| %s | %.2f | %.2f | %.2f | %s |\n", vars[i].name.c_str(), med, v[v.size() / 10],
                v[v.size() * 9 / 10], i == 0 ? "-" : std::to_string(static_cast<int>(mb * 1e3 / med)).c_str());
  }
  return 0;
}
