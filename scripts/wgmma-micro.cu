// wgmma throughput on a GPU machine: A in registers or shared memory, N 64
// or 128, u8 x s8 and s8 x s8 (nvcc -gencode=arch=compute_90a,code=sm_90a
// scripts/wgmma-micro.cu). Operands fixed: the tensor pipe alone.
#include <cstdio>
#include <cuda_runtime.h>
typedef unsigned int u32; typedef unsigned long long u64;
__device__ __forceinline__ u64 desc(u32 addr, u32 lead, u32 stride) { return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(lead >> 4) << 16) | ((u64)(stride >> 4) << 32); }
#define R8(i) "+r"(c[i]), "+r"(c[i+1]), "+r"(c[i+2]), "+r"(c[i+3]), "+r"(c[i+4]), "+r"(c[i+5]), "+r"(c[i+6]), "+r"(c[i+7])
template <int MODE> __device__ __forceinline__ void mma(int* c, const u32* a, u64 ad, u64 bd);
// RS n128
template <> __device__ __forceinline__ void mma<0>(int* c, const u32* a, u64 ad, u64 bd) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n128k32.s32.u8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p;\n}"
  : R8(0),R8(8),R8(16),R8(24),R8(32),R8(40),R8(48),R8(56) : "r"(a[0]),"r"(a[1]),"r"(a[2]),"r"(a[3]),"l"(bd)); }
// SS n128
template <> __device__ __forceinline__ void mma<1>(int* c, const u32* a, u64 ad, u64 bd) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n128k32.s32.u8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p;\n}"
  : R8(0),R8(8),R8(16),R8(24),R8(32),R8(40),R8(48),R8(56) : "l"(ad),"l"(bd)); }
// RS n64
template <> __device__ __forceinline__ void mma<2>(int* c, const u32* a, u64 ad, u64 bd) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n64k32.s32.u8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p;\n}"
  : R8(0),R8(8),R8(16),R8(24) : "r"(a[0]),"r"(a[1]),"r"(a[2]),"r"(a[3]),"l"(bd)); }
// RS n128 s8.s8
template <> __device__ __forceinline__ void mma<3>(int* c, const u32* a, u64 ad, u64 bd) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p;\n}"
  : R8(0),R8(8),R8(16),R8(24),R8(32),R8(40),R8(48),R8(56) : "r"(a[0]),"r"(a[1]),"r"(a[2]),"r"(a[3]),"l"(bd)); }
template <int MODE, int NACC, int LEAD>
__global__ void __launch_bounds__(256, 1) k(int* out, long long* clk, int iters) {
  __shared__ __align__(1024) unsigned char sm[64 * 1024];
  for (int i = threadIdx.x; i < 64 * 1024 / 4; i += blockDim.x) ((u32*)sm)[i] = i * 2654435761u;
  __syncthreads();
  u32 base = (u32)__cvta_generic_to_shared(sm);
  int c[NACC];
  for (int i = 0; i < NACC; ++i) c[i] = 0;
  u32 a[8][4];
  for (int s = 0; s < 8; ++s) for (int j = 0; j < 4; ++j) a[s][j] = (threadIdx.x * 7 + s * 3 + j) & 0x03030303u;
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
  long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int s = 0; s < 8; ++s) mma<MODE>(c, a[s], desc(base + 32768 + s * 256, 128, 256), desc(base + s * 2 * LEAD, LEAD, 128));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
  }
  long long t1 = clock64();
  int s = 0; for (int i = 0; i < NACC; ++i) s += c[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) clk[blockIdx.x] = t1 - t0;
}
int main() {
  int* out; long long* clk; cudaMalloc(&out, 132 * 256 * 4); cudaMalloc(&clk, 132 * 8);
  long long h[132]; int iters = 2000;
  auto run = [&](const char* name, auto kern, int n, int blocks) {
    kern<<<blocks, 256>>>(out, clk, 10); cudaDeviceSynchronize();
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    cudaEventRecord(e0); kern<<<blocks, 256>>>(out, clk, iters); cudaEventRecord(e1); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1);
    cudaMemcpy(h, clk, 8, cudaMemcpyDeviceToHost);
    double macs = 2.0 /*WGs*/ * 8 * 64.0 * n * 32 * iters;
    printf("%-14s blocks %3d: %.1f clk per wgmma per WG-pair, %.0f MAC/clk/SM, %.0f TOPS (err %s)\n", name, blocks, (double)h[0] / (iters * 8), macs / h[0], 2 * macs * blocks / (ms * 1e-3) / 1e12, cudaGetErrorString(cudaGetLastError()));
  };
  run("RS u8s8 n128", k<0, 64, 2048>, 128, 132);
  run("SS u8s8 n128", k<1, 64, 2048>, 128, 132);
  run("RS u8s8 n64", k<2, 32, 1024>, 64, 132);
  run("RS s8s8 n128", k<3, 64, 2048>, 128, 132);
  run("RS u8s8 n128 1blk", k<0, 64, 2048>, 128, 1);
  return 0;
}
