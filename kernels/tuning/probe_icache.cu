// What a kernel's code size costs a call that runs each instruction once (one row: one tile per split CTA).
//
// A stand-alone model: 10 CTAs of 256 threads (as one V4 CSA row's split kernel) run N fused multiply-adds per
// thread in 8 independent chains, either as straight-line code (N instructions of SASS, each fetched once) or as a
// loop of 64 of them that is not unrolled (the same work from 1 KB of code). Timed as the benchmark times (CUDA
// events, ~1 ms of device sleep so the launch is queued), median of --reps, the variants round-robin, in two cache
// states: cold (L2 evicted by a 512 MB read before every repeat: the code comes from DRAM) and warm (nothing
// evicted). If a call's time grows with its straight-line code and not with the same work looped, what one row
// pays for is fetching its instructions, not executing them.
// Build: nvcc -std=c++17 -O3 -arch=sm_90a -cudart static kernels/tuning/probe_icache.cu -o probe_icache
// Run: ./probe_icache [reps] [ctas]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "probe_common.cuh"

constexpr int kThreads = 256, kChains = 8;

// 8 independent chains, each step an FFMA with a distinct immediate (so the compiler cannot fold steps together).
template <int STEPS>
__device__ __forceinline__ void chains(float (&x)[kChains], float y) {
#pragma unroll
  for (int i = 0; i < STEPS; ++i)
#pragma unroll
    for (int c = 0; c < kChains; ++c) x[c] = fmaf(x[c], y, static_cast<float>(i * kChains + c) * 0.0009765625f);
}

// N = STEPS x 8 FFMAs per thread as straight-line code.
template <int STEPS>
__global__ void __launch_bounds__(kThreads) straight_kernel(float* out, float y) {
  float x[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) x[c] = threadIdx.x + c;
  chains<STEPS>(x, y);
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) s += x[c];
  if (s == 1234.5f) out[blockIdx.x] = s;   // never true: keeps the work
}

// The same N FFMAs as a loop of 64 per iteration (8 steps), not unrolled.
__global__ void __launch_bounds__(kThreads) looped_kernel(float* out, float y, int iters) {
  float x[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) x[c] = threadIdx.x + c;
#pragma unroll 1
  for (int it = 0; it < iters; ++it) chains<8>(x, y + it * 1e-9f);
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kChains; ++c) s += x[c];
  if (s == 1234.5f) out[blockIdx.x] = s;
}

struct Variant {
  std::string name;
  int ffma;                 // per thread
  void (*launch)(int ctas, float* out, cudaStream_t st);
};

template <int STEPS>
void launch_straight(int ctas, float* out, cudaStream_t st) {
  straight_kernel<STEPS><<<ctas, kThreads, 0, st>>>(out, 1.0001f);
}
template <int STEPS>
void launch_looped(int ctas, float* out, cudaStream_t st) {
  looped_kernel<<<ctas, kThreads, 0, st>>>(out, 1.0001f, STEPS / 8);
}

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  const int ctas = argc > 2 ? std::atoi(argv[2]) : 10;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t flush_bytes = 512u << 20;
  uint4* flush;
  int* sink;
  float* out;
  CK(cudaMalloc(&flush, flush_bytes));
  CK(cudaMemset(flush, 1, flush_bytes));
  CK(cudaMalloc(&sink, sizeof(int)));
  CK(cudaMalloc(&out, 1024 * sizeof(float)));
  int sms = 0, clock_khz = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  const long long sleep_cycles = static_cast<long long>(clock_khz);   // ~1 ms

  const std::vector<Variant> vars = {
      {"straight", 8, launch_straight<1>},       {"straight", 512, launch_straight<64>},
      {"straight", 1024, launch_straight<128>},  {"straight", 2048, launch_straight<256>},
      {"straight", 4096, launch_straight<512>},  {"looped", 512, launch_looped<64>},
      {"looped", 1024, launch_looped<128>},      {"looped", 2048, launch_looped<256>},
      {"looped", 4096, launch_looped<512>},
  };
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (const auto& v : vars) v.launch(ctas, out, st);
  CK(cudaStreamSynchronize(st));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs; %d CTAs x %d threads, %d reps\n", prop.name, sms, ctas, kThreads, reps);
  std::printf("| code | FFMA per thread | cold median us | cold p10 | cold p90 | warm median us |\n|---|---|---|---|---|---|\n");
  std::vector<std::vector<float>> cold(vars.size()), warm(vars.size());
  for (int state = 0; state < 2; ++state)
    for (int r = 0; r < reps; ++r)
      for (size_t i = 0; i < vars.size(); ++i) {
        if (state == 0) {
          const size_t n16 = flush_bytes / 16;
          flush_kernel<<<sms * 4, 512, 0, st>>>(flush, n16, sink);
        }
        sleep_kernel<<<1, 1, 0, st>>>(sleep_cycles);
        CK(cudaEventRecord(e0, st));
        vars[i].launch(ctas, out, st);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0.f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        (state == 0 ? cold : warm)[i].push_back(ms * 1e3f);
      }
  for (size_t i = 0; i < vars.size(); ++i) {
    auto c = cold[i], w = warm[i];
    std::sort(c.begin(), c.end());
    std::sort(w.begin(), w.end());
    std::printf("| %s | %d | %.2f | %.2f | %.2f | %.2f |\n", vars[i].name.c_str(), vars[i].ffma, c[c.size() / 2],
                c[c.size() / 10], c[c.size() * 9 / 10], w[w.size() / 2]);
  }
  return 0;
}
