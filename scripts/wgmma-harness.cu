// Dev harness for kernels/ternary_wgmma.cu (branch wgmma-gemm, not on main):
// nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icrates/cuda/kernels scripts/wgmma-harness.cu
// Dev harness (not in the repo): ternary_gemm_wg against a CPU reference and
// against ternary_gemm, then timings at the 2B-4T shapes.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cmath>
#include <cuda_runtime.h>
#include "prelude.cuh"
#include "ternary.cu"
#include "ternary_wgmma.cu"
extern "C" __global__ void __launch_bounds__(256, 1) wg128s3(TernaryBatch b, int k_pad, const i8* q, const float* d, const int* lsum, int n_tok) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
 wg_gemm<128>(b, k_pad, q, d, lsum, n_tok);
#endif
}
extern "C" __global__ void __launch_bounds__(256, 1) wg64s3(TernaryBatch b, int k_pad, const i8* q, const float* d, const int* lsum, int n_tok) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
 wg_gemm<64>(b, k_pad, q, d, lsum, n_tok);
#endif
}
#define CK(x) do { cudaError_t e = (x); if (e) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)
static unsigned long long rs = 12345;
static unsigned rnd() { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return (unsigned)rs; }
struct Case { int rows, k, n; bool cpu; };
typedef void (*KFn)(TernaryBatch, int, const i8*, const float*, const int*, int);
int main(int argc, char** argv) {
  Case cases[] = {{300, 512, 77, true}, {640, 2560, 130, true}, {129, 256, 1000, true}, {2560, 2560, 512, false},
                  {13824, 2560, 2048, false}, {2560, 6912, 2048, false}, {3840, 2560, 300, false}};
  int fails = 0;
  int only = argc > 1 ? atoi(argv[1]) : -1, ci = -1;
  for (auto& cs : cases) {
    if (++ci, only >= 0 && ci != only) continue;
    int rows = cs.rows, k = cs.k, n = cs.n, rb = k / 4, nls = k / 64;
    int rows_pad = (rows + 255) / 256 * 256;
    std::vector<unsigned char> W((size_t)rows_pad * rb, 0);
    for (size_t r = 0; r < (size_t)rows; ++r)
      for (int i = 0; i < rb; ++i) { unsigned char b = 0; for (int j = 0; j < 4; ++j) b |= (rnd() % 3) << (2 * j); W[r * rb + i] = b; }
    std::vector<signed char> A((size_t)n * k);
    for (auto& a : A) a = (signed char)((int)(rnd() % 255) - 127);
    std::vector<float> sc(rows), dd(n);
    for (auto& s : sc) s = 0.5f + (rnd() % 1000) / 1000.0f;
    for (auto& s : dd) s = 0.001f + (rnd() % 1000) / 1e6f;
    std::vector<int> ls((size_t)n * nls);
    for (int t = 0; t < n; ++t) for (int i = 0; i < nls; ++i) { int s = 0; for (int j = 0; j < 64; ++j) s += A[(size_t)t * k + i * 64 + j]; ls[(size_t)t * nls + i] = s; }
    unsigned char* dW; signed char* dA; float *dS, *dD, *o1, *o2, *o3; int* dL;
    CK(cudaMalloc(&dW, W.size())); CK(cudaMemcpy(dW, W.data(), W.size(), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dA, A.size())); CK(cudaMemcpy(dA, A.data(), A.size(), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dS, rows * 4)); CK(cudaMemcpy(dS, sc.data(), rows * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dD, n * 4)); CK(cudaMemcpy(dD, dd.data(), n * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dL, ls.size() * 4)); CK(cudaMemcpy(dL, ls.data(), ls.size() * 4, cudaMemcpyHostToDevice));
    size_t on = (size_t)n * rows;
    CK(cudaMalloc(&o1, on * 4)); CK(cudaMalloc(&o2, on * 4)); CK(cudaMalloc(&o3, on * 4));
    auto batch = [&](float* out, int per) { TernaryBatch b; memset(&b, 0, sizeof b); b.n = 1; b.m[0].w = dW; b.m[0].scales = dS; b.m[0].out = out; b.m[0].res = nullptr; b.m[0].rows = rows; b.m[0].groups = 1; b.block_start[0] = 0; b.block_start[1] = (rows + per - 1) / per; return b; };
    int sm128 = wg_smem_bytes<128>(), sm64 = wg_smem_bytes<64>(), s3_128 = wg_smem_bytes<128>(), s3_64 = wg_smem_bytes<64>();
    CK(cudaFuncSetAttribute(wg128s3, cudaFuncAttributeMaxDynamicSharedMemorySize, s3_128)); CK(cudaFuncSetAttribute(wg64s3, cudaFuncAttributeMaxDynamicSharedMemorySize, s3_64));
    CK(cudaFuncSetAttribute(ternary_gemm_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, sm128));
    CK(cudaFuncSetAttribute(ternary_gemm_wg64, cudaFuncAttributeMaxDynamicSharedMemorySize, sm64));
    auto run_old = [&]() { ternary_gemm<<<dim3((rows + 255) / 256, (n + 31) / 32), 256>>>(batch(o1, 256), k, dA, dD, dL, n); };
    auto run_wg = [&]() { ternary_gemm_wg<<<dim3((rows + 127) / 128, (n + 127) / 128), 256, sm128>>>(batch(o2, 128), k, dA, dD, dL, n); };
    auto run_a = [&]() { wg128s3<<<dim3((rows + 127) / 128, (n + 127) / 128), 256, s3_128>>>(batch(o2, 128), k, dA, dD, dL, n); };
    auto run_b = [&]() { wg64s3<<<dim3((rows + 127) / 128, (n + 63) / 64), 256, s3_64>>>(batch(o3, 128), k, dA, dD, dL, n); };
    auto run_wg64 = [&]() { ternary_gemm_wg64<<<dim3((rows + 127) / 128, (n + 63) / 64), 256, sm64>>>(batch(o3, 128), k, dA, dD, dL, n); };
    CK(cudaMemset(o1, 0xff, on * 4)); CK(cudaMemset(o2, 0xff, on * 4)); CK(cudaMemset(o3, 0xff, on * 4));
    run_old(); run_wg(); run_wg64(); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
    std::vector<float> h1(on), h2(on), h3(on);
    CK(cudaMemcpy(h1.data(), o1, on * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h2.data(), o2, on * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h3.data(), o3, on * 4, cudaMemcpyDeviceToHost));
    std::vector<float> ref = h1;
    if (cs.cpu) {
      for (int t = 0; t < n; ++t) { long tsum = 0; for (int i = 0; i < k; ++i) tsum += A[(size_t)t * k + i];
        for (int r = 0; r < rows; ++r) { long acc = 0;
          for (int c = 0; c < k / 256; ++c) for (int tg = 0; tg < 4; ++tg) for (int w = 0; w < 4; ++w) for (int j = 0; j < 4; ++j) for (int b = 0; b < 4; ++b) {
            int code = (W[(size_t)r * rb + c * 64 + tg * 16 + w * 4 + b] >> (2 * j)) & 3;
            acc += code * A[(size_t)t * k + c * 256 + tg * 64 + (4 * w + j) * 4 + b]; }
          ref[(size_t)t * rows + r] = (float)(acc - tsum) * sc[r] * dd[t]; } }
    }
    auto cmp = [&](const char* name, std::vector<float>& h) {
      double worst = 0, big = 0; size_t bad = 0, first = (size_t)-1;
      for (size_t i = 0; i < on; ++i) { big = fmax(big, fabs(ref[i])); double e = fabs((double)h[i] - ref[i]); if (!(e <= 1e-6 * (fabs(ref[i]) + 1e-3))) { if (bad == 0) first = i; ++bad; } if (e > worst || e != e) worst = e; }
      printf("  %-6s vs %s: bad %zu of %zu, worst %.3g (largest %.3g)", name, cs.cpu ? "cpu" : "old", bad, on, worst, big);
      if (bad) printf(" first at tok %zu row %zu: %g vs %g", first / rows, first % rows, h[first], ref[first]);
      printf("\n"); fails += bad != 0; };
    printf("rows %d k %d n %d\n", rows, k, n);
    if (cs.cpu) cmp("old", h1);
    cmp("wg128", h2); cmp("wg64", h3);
    run_a(); run_b(); CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h2.data(), o2, on * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(h3.data(), o3, on * 4, cudaMemcpyDeviceToHost));
    cmp("128s3", h2); cmp("64s3", h3);
    if (!cs.cpu) {
      cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
      auto timeit = [&](const char* name, auto fn) { for (int i = 0; i < 3; ++i) fn(); cudaEventRecord(e0); for (int i = 0; i < 20; ++i) fn(); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); double us = ms * 1000 / 20; printf("  %-6s %8.1f us  %6.0f TOPS\n", name, us, 2.0 * rows * k * (double)n / us / 1e6); };
      timeit("old", run_old); timeit("wg128", run_wg); timeit("wg64", run_wg64); timeit("128s3", run_a); timeit("64s3", run_b);
    }
    cudaFree(dW); cudaFree(dA); cudaFree(dS); cudaFree(dD); cudaFree(dL); cudaFree(o1); cudaFree(o2); cudaFree(o3);
  }
  printf(fails ? "FAIL %d\n" : "ALL OK\n", fails);
  return fails != 0;
}
