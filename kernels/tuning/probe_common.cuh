// What the stand-alone CUDA probes (probe_handoff.cu, probe_icache.cu) share: a CUDA error check, and the two kernels
// that time a call as the benchmark does (harness.Timer): an L2 eviction by reading a buffer larger than L2, and a
// device sleep so that the host has queued the timed launches before the timed window opens.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

// Reads n 16-byte words (clean lines: nothing to write back when the timed call evicts them).
__global__ void flush_kernel(const uint4* buf, size_t n, int* sink) {
  unsigned int acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const uint4 v = buf[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = 1;
}
__global__ void sleep_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
