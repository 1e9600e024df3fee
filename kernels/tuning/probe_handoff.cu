// What the hand-over from a split kernel to its combine costs at one row, apart from everything else.
//
// A stand-alone model of one sparse MLA decode call at B=1, h=16 (V4 CSA: 10 splits of 64 entries): each
// split CTA loads its 64 indices, gathers 64 records of 1 KB through them, and writes a 16 x 512 fp32 partial
// and 16 lse values; a combine merges the splits into 16 x 512 bf16. Timed as the benchmark times (CUDA events,
// L2 evicted by a 512 MB read before every repeat, ~1 ms of device sleep so the launches are queued), median of
// --reps, the modes round-robin. The modes differ only in how the combine learns that the partials are there:
//   empty      one CTA that writes one int (what the method reads for nothing)
//   main       the split kernel alone
//   wait       + the combine as a programmatic dependent launch waiting in griddepcontrol.wait (production)
//   plain      + the combine as an ordinary launch
//   spin       + the combine launched the same way, but waiting on an arrival counter the split CTAs release
//              (red.release.gpu after their stores) instead of on the grid's completion
//   merge      no combine kernel: the split CTAs arrive, spin until all have, and each merges 1/splits of the
//              outputs (cooperative launch, so all are resident)
//   direct     main without the index round trip (records at addresses computed from the CTA's position)
//   cluster    no combine kernel and no partials in global memory: the row's split CTAs are one thread-block
//              cluster, each keeps its partial in shared memory, and after a cluster barrier each merges
//              1/splits of the outputs reading its peers' shared memory (a second barrier before any exits)
// Build: nvcc -std=c++17 -O3 -arch=sm_90a -cudart static kernels/tuning/probe_handoff.cu -o probe_handoff
// Run: ./probe_handoff [reps] [splits]
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "probe_common.cuh"

constexpr int kEntries = 64;     // per split
constexpr int kRecBytes = 1024;  // per record (V4's fp8 record is 584 B, its bf16 one 1152 B)
constexpr int kHeads = 16, kDv = 512;
constexpr int kMainThreads = 256, kCombineThreads = 128;

struct Params {
  const int* idx;        // [splits * kEntries]
  const uint4* pool;     // records
  float* part;           // [splits][kHeads][kDv]
  float* lse;            // [splits][kHeads]
  unsigned short* out;   // [kHeads][kDv] bf16 bits
  int* ctr;              // [0] arrivals, [1] combine CTAs done
  int splits;
  int direct;            // 1: no index load
  int arrive;            // 1: release one arrival per split CTA after its stores
};

__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void dep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned short bf16_bits(float f) {
  unsigned int u = __float_as_uint(f);
  return static_cast<unsigned short>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The split CTA's work: its indices (one DRAM round trip), then its records (a second), a reduction standing in for
// QK / softmax / PV, and the partial's stores.
__device__ __forceinline__ void split_work(const Params& p, int split, int tid, int* sidx, float* red, float* part,
                                           float* lse) {
  if (tid < kEntries) sidx[tid] = p.direct ? split * kEntries + tid : __ldg(p.idx + split * kEntries + tid);
  __syncthreads();
  constexpr int kChunks = kRecBytes / 16, kPer = kEntries * kChunks / kMainThreads;
  uint4 v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int item = i * kMainThreads + tid, e = item / kChunks, c = item % kChunks;
    v[i] = __ldg(p.pool + static_cast<size_t>(sidx[e]) * kChunks + c);
  }
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc += __uint_as_float((v[i].x ^ v[i].y ^ v[i].z ^ v[i].w) & 0x3f7fffffu);
  red[tid] = acc;
  __syncthreads();
  const float s = red[(tid + 1) % kMainThreads] * 1e-3f;
  float4* dst = reinterpret_cast<float4*>(part);
#pragma unroll
  for (int i = 0; i < kHeads * kDv / 4 / kMainThreads; ++i)
    dst[i * kMainThreads + tid] = make_float4(s + i, s - i, s * i, s + 2 * i);
  if (tid < kHeads) lse[tid] = s * (tid + 1) * 1e-3f + split * 0.01f;
}
__device__ __forceinline__ void split_work(const Params& p, int split, int tid, int* sidx, float* red) {
  split_work(p, split, tid, sidx, red, p.part + static_cast<size_t>(split) * kHeads * kDv, p.lse + split * kHeads);
}

// Merges the outputs from `first` (a flat index into kHeads x kDv, four per thread) for `n4` groups of four;
// `src(s)` gives split s's partial and lse (global memory, or a peer's shared memory).
struct GlobalPartials {   // read through L2 (__ldcg): another CTA wrote them
  const Params& p;
  __device__ float lse(int s, int head) const { return __ldcg(p.lse + s * kHeads + head); }
  __device__ float4 part4(int s, int flat) const {
    return __ldcg(reinterpret_cast<const float4*>(p.part + static_cast<size_t>(s) * kHeads * kDv + flat));
  }
};
template <class Src>
__device__ __forceinline__ void merge_outputs(const Params& p, const Src& src, int first4, int n4, int tid, int nthr) {
  for (int g = tid; g < n4; g += nthr) {
    const int flat = 4 * (first4 + g), head = flat / kDv;
    float l[16];
    float4 o[16];
#pragma unroll
    for (int s = 0; s < 16; ++s) {
      l[s] = -INFINITY;
      o[s] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (s < p.splits) {
        l[s] = src.lse(s, head);
        o[s] = src.part4(s, flat);
      }
    }
    float m = -INFINITY;
#pragma unroll
    for (int s = 0; s < 16; ++s) m = fmaxf(m, l[s]);
    float w = 0.f, a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll
    for (int s = 0; s < 16; ++s) {
      const float e = l[s] == -INFINITY ? 0.f : __expf(l[s] - m);
      w += e;
      a0 += e * o[s].x;
      a1 += e * o[s].y;
      a2 += e * o[s].z;
      a3 += e * o[s].w;
    }
    const float f = __fdividef(1.f, w);
    uint2 v;
    v.x = bf16_bits(a0 * f) | (static_cast<unsigned>(bf16_bits(a1 * f)) << 16);
    v.y = bf16_bits(a2 * f) | (static_cast<unsigned>(bf16_bits(a3 * f)) << 16);
    reinterpret_cast<uint2*>(p.out)[first4 + g] = v;
  }
}

__global__ void __launch_bounds__(kMainThreads) split_kernel(const Params p) {
  __shared__ int sidx[kEntries];
  __shared__ float red[kMainThreads];
  launch_dependents();
  split_work(p, blockIdx.x, threadIdx.x, sidx, red);
  if (p.arrive) {
    __syncthreads();   // every thread's stores happen before thread 0's release (cumulativity)
    if (threadIdx.x == 0) red_release_add(p.ctr, 1);
  }
}

// grid kHeads: one CTA per head, as the production combine at one row.
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const Params p, int mode) {
  __shared__ int last;
  if (mode == 0) {
    dep_wait();
  } else {
    if (threadIdx.x == 0)
      while (ld_acquire(p.ctr) < p.splits) __nanosleep(32);
    __syncthreads();
  }
  merge_outputs(p, GlobalPartials{p}, blockIdx.x * kDv / 4, kDv / 4, threadIdx.x, kCombineThreads);
  if (mode != 0) {   // the last CTA past the wait puts the counters back for the next call
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(p.ctr + 1, 1) == static_cast<int>(gridDim.x) - 1;
    __syncthreads();
    if (last && threadIdx.x == 0) {
      p.ctr[0] = 0;
      p.ctr[1] = 0;
    }
  }
}

// No second kernel: every split CTA arrives, waits for all, merges its share.
__global__ void __launch_bounds__(kMainThreads) merge_kernel(const Params p) {
  __shared__ int sidx[kEntries];
  __shared__ float red[kMainThreads];
  __shared__ int last;
  split_work(p, blockIdx.x, threadIdx.x, sidx, red);
  __syncthreads();
  if (threadIdx.x == 0) {
    red_release_add(p.ctr, 1);
    while (ld_acquire(p.ctr) < p.splits) __nanosleep(32);
  }
  __syncthreads();
  const int total4 = kHeads * kDv / 4, per = (total4 + p.splits - 1) / p.splits;
  const int first = blockIdx.x * per, n = max(0, min(per, total4 - first));
  merge_outputs(p, GlobalPartials{p}, first, n, threadIdx.x, kMainThreads);
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(p.ctr + 1, 1) == p.splits - 1;
  __syncthreads();
  if (last && threadIdx.x == 0) {
    p.ctr[0] = 0;
    p.ctr[1] = 0;
  }
}

// The row's split CTAs as one cluster: partials in shared memory, merged through distributed shared memory.
struct PeerPartials {
  float* part0;   // this CTA's partial; its lse follows it
  __device__ const float* peer(int s) const {
    return cooperative_groups::this_cluster().map_shared_rank(part0, static_cast<unsigned>(s));
  }
  __device__ float lse(int s, int head) const { return peer(s)[kHeads * kDv + head]; }
  __device__ float4 part4(int s, int flat) const { return *reinterpret_cast<const float4*>(peer(s) + flat); }
};
constexpr int kClusterSmem = (kHeads * kDv + kHeads) * sizeof(float);
__global__ void __launch_bounds__(kMainThreads) cluster_kernel(const Params p) {
  extern __shared__ float4 dyn[];
  __shared__ int sidx[kEntries];
  __shared__ float red[kMainThreads];
  float* part = reinterpret_cast<float*>(dyn);
  split_work(p, blockIdx.x, threadIdx.x, sidx, red, part, part + kHeads * kDv);
  auto cluster = cooperative_groups::this_cluster();
  cluster.sync();   // every partial is in its CTA's shared memory
  const int total4 = kHeads * kDv / 4, per = (total4 + p.splits - 1) / p.splits;
  const int first = blockIdx.x * per, n = max(0, min(per, total4 - first));
  merge_outputs(p, PeerPartials{part}, first, n, threadIdx.x, kMainThreads);
  cluster.sync();   // no CTA leaves while a peer still reads its shared memory
}

__global__ void empty_kernel(int* x) {
  if (threadIdx.x == 0) x[0] += 1;
}

static void launch(const void* fn, dim3 grid, dim3 block, void** args, bool pdl, bool coop, cudaStream_t st,
                   int cluster = 0, int smem = 0) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.stream = st;
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (cluster) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  } else if (coop) {
    attr[n].id = cudaLaunchAttributeCooperative;
    attr[n].val.cooperative = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  CK(cudaLaunchKernelExC(&cfg, fn, args));
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  const int splits = argc > 2 ? std::atoi(argv[2]) : 10;
  if (splits < 1 || splits > 16) {
    std::fprintf(stderr, "splits must be 1..16\n");
    return 2;
  }
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t pool_records = (512u << 20) / kRecBytes;   // a 512 MB pool: the gathers miss like a server's
  const size_t flush_bytes = 512u << 20;
  uint4 *pool, *flush;
  int *idx, *ctr, *sink;
  float *part, *lse;
  unsigned short* out;
  CK(cudaMalloc(&pool, pool_records * kRecBytes));
  CK(cudaMemset(pool, 0x3c, pool_records * kRecBytes));
  CK(cudaMalloc(&flush, flush_bytes));
  CK(cudaMemset(flush, 1, flush_bytes));
  CK(cudaMalloc(&idx, 16 * kEntries * sizeof(int)));
  CK(cudaMalloc(&ctr, 64 * sizeof(int)));
  CK(cudaMemset(ctr, 0, 64 * sizeof(int)));
  CK(cudaMalloc(&sink, sizeof(int)));
  CK(cudaMalloc(&part, 16 * kHeads * kDv * sizeof(float)));
  CK(cudaMalloc(&lse, 16 * kHeads * sizeof(float)));
  CK(cudaMalloc(&out, kHeads * kDv * 2));
  std::mt19937 gen(7);
  std::vector<int> h_idx(16 * kEntries);
  for (auto& v : h_idx) v = static_cast<int>(gen() % pool_records);
  CK(cudaMemcpy(idx, h_idx.data(), h_idx.size() * sizeof(int), cudaMemcpyHostToDevice));

  int sms = 0, clock_khz = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const long long sleep_cycles = static_cast<long long>(clock_khz) * 1;   // ~1 ms

  CK(cudaFuncSetAttribute(reinterpret_cast<const void*>(cluster_kernel), cudaFuncAttributeNonPortableClusterSizeAllowed,
                          1));
  const std::vector<std::string> modes = {"empty", "main", "wait", "plain", "spin", "merge", "direct", "cluster"};
  std::vector<std::vector<float>> times(modes.size());
  std::vector<std::vector<unsigned short>> outs(modes.size());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));

  auto run_mode = [&](int m) {
    Params p{idx, pool, part, lse, out, ctr, splits, 0, 0};
    int cmode = 0;
    void* margs[] = {&p};
    void* cargs[] = {&p, &cmode};
    const std::string& name = modes[m];
    if (name == "empty") {
      void* a[] = {&sink};
      launch(reinterpret_cast<const void*>(empty_kernel), dim3(1), dim3(32), a, false, false, st);
    } else if (name == "main" || name == "direct") {
      p.direct = name == "direct";
      launch(reinterpret_cast<const void*>(split_kernel), dim3(splits), dim3(kMainThreads), margs, false, false, st);
    } else if (name == "wait" || name == "plain") {
      launch(reinterpret_cast<const void*>(split_kernel), dim3(splits), dim3(kMainThreads), margs, false, false, st);
      launch(reinterpret_cast<const void*>(combine_kernel), dim3(kHeads), dim3(kCombineThreads), cargs,
             name == "wait", false, st);
    } else if (name == "spin") {
      p.arrive = 1;
      cmode = 1;
      launch(reinterpret_cast<const void*>(split_kernel), dim3(splits), dim3(kMainThreads), margs, false, false, st);
      launch(reinterpret_cast<const void*>(combine_kernel), dim3(kHeads), dim3(kCombineThreads), cargs, true, false,
             st);
    } else if (name == "merge") {
      launch(reinterpret_cast<const void*>(merge_kernel), dim3(splits), dim3(kMainThreads), margs, false, true, st);
    } else if (name == "cluster") {
      launch(reinterpret_cast<const void*>(cluster_kernel), dim3(splits), dim3(kMainThreads), margs, false, false, st,
             splits, kClusterSmem);
    }
  };
  // Warm up, and check that every combining mode writes the same outputs.
  for (size_t m = 0; m < modes.size(); ++m) {
    CK(cudaMemsetAsync(out, 0, kHeads * kDv * 2, st));
    run_mode(static_cast<int>(m));
    CK(cudaStreamSynchronize(st));
    outs[m].resize(kHeads * kDv);
    CK(cudaMemcpy(outs[m].data(), out, kHeads * kDv * 2, cudaMemcpyDeviceToHost));
  }
  const int ref = 2;   // "wait"
  for (size_t m = 0; m < modes.size(); ++m)
    if ((modes[m] == "plain" || modes[m] == "spin" || modes[m] == "merge" || modes[m] == "cluster") &&
        outs[m] != outs[ref]) {
      std::fprintf(stderr, "mode %s: outputs differ from wait\n", modes[m].c_str());
      return 1;
    }
  for (int r = 0; r < reps; ++r)
    for (size_t m = 0; m < modes.size(); ++m) {
      void* fa[] = {&flush, nullptr, &sink};
      size_t n16 = flush_bytes / 16;
      fa[1] = &n16;
      launch(reinterpret_cast<const void*>(flush_kernel), dim3(sms * 4), dim3(512), fa, false, false, st);
      void* sa[] = {const_cast<long long*>(&sleep_cycles)};
      launch(reinterpret_cast<const void*>(sleep_kernel), dim3(1), dim3(1), sa, false, false, st);
      CK(cudaEventRecord(e0, st));
      run_mode(static_cast<int>(m));
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms = 0.f;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      times[m].push_back(ms * 1e3f);
    }
  int ctr_after[2];
  CK(cudaMemcpy(ctr_after, ctr, sizeof(ctr_after), cudaMemcpyDeviceToHost));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs; splits %d, %d entries x %d B per split, %d reps; counters after: %d %d\n", prop.name,
              sms, splits, kEntries, kRecBytes, reps, ctr_after[0], ctr_after[1]);
  std::printf("| mode | median us | p10 us | p90 us |\n|---|---|---|---|\n");
  for (size_t m = 0; m < modes.size(); ++m) {
    auto t = times[m];
    std::sort(t.begin(), t.end());
    std::printf("| %s | %.2f | %.2f | %.2f |\n", modes[m].c_str(), t[t.size() / 2], t[t.size() / 10],
                t[t.size() * 9 / 10]);
  }
  return 0;
}
