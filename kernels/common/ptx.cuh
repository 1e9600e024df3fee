#pragma once
// Inline-PTX wrappers that both kernel modules (dsa_indexer, sparse_mla_decode) use, written once. Each module is
// one translation unit and includes this first; the functions are internal to it, as the module's own are.
#include <cstdint>

namespace {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Programmatic dependent launch (sm_90+; no-ops without the launch attribute and before sm_90): a kernel lets the
// launch that depends on it (the split combine, the indexer's select) be scheduled from its start, so that launch's
// prologue overlaps it instead of following it; the dependent kernel waits in griddep_wait until the first one's
// memory is visible.
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace
