// Dev harness for kernels/ternary_wgmma.cu on a GPU machine, outside the
// engine: ternary_gemm_wg and a few other shapes of it (NT tokens, CW consumer
// warpgroups, stages) against a CPU reference and against ternary_gemm
// (bit-exact), then CUDA-event timings at the 2B-4T shapes. Build there:
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a \
//        -Icrates/cuda/kernels scripts/wgmma-harness.cu -o /tmp/h -lcuda
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cmath>
#include <cuda.h>
#include <cuda_runtime.h>
#include "prelude.cuh"
#include "ternary.cu"
#include "ternary_wgmma.cu"
#define VAR(NAME, NT, CW, ST) extern "C" __global__ void __launch_bounds__(128 * CW + 32, 1) NAME(TernaryBatch b, const __grid_constant__ TmaMap tq, const __grid_constant__ TmaMap tw0, int k_pad, const float* d, const int* lsum, int n_tok) { VBODY(NT, CW, ST) }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define VBODY(NT, CW, ST) wg_gemm<NT, CW, ST>(b, 0, &tq, &tw0, k_pad, d, lsum, n_tok);
#else
#define VBODY(NT, CW, ST)
#endif
VAR(v_128_3_4, 128, 3, 4)
VAR(v_128_2_5, 128, 2, 5)
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
    int sm128 = wg_smem_bytes<WG_NT, WG_CW, WG_STAGES>();
    CK(cudaFuncSetAttribute(ternary_gemm_wg, cudaFuncAttributeMaxDynamicSharedMemorySize, sm128));
    auto enc = [&](TmaMap* m, void* ptr, int inner, int outer, int bx, int by, CUtensorMapSwizzle sw) {
      cuuint64_t dims[2] = {(cuuint64_t)inner, (cuuint64_t)outer}, str[1] = {(cuuint64_t)inner}; cuuint32_t box[2] = {(cuuint32_t)bx, (cuuint32_t)by}, es[2] = {1, 1};
      CUresult r = cuTensorMapEncodeTiled((CUtensorMap*)m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, ptr, dims, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      if (r) { printf("encode %d\n", r); exit(1); } };
    TmaMap tq, tw, tw192, twm;
    enc(&twm, dW, rb, rows, 64, 64 * WG_CW, CU_TENSOR_MAP_SWIZZLE_64B);
    enc(&tw192, dW, rb, rows, 64, 192, CU_TENSOR_MAP_SWIZZLE_64B);
    int smA = wg_smem_bytes<128, 3, 4>(), smC = wg_smem_bytes<128, 2, 5>();
    CK(cudaFuncSetAttribute(v_128_3_4, cudaFuncAttributeMaxDynamicSharedMemorySize, smA));
    CK(cudaFuncSetAttribute(v_128_2_5, cudaFuncAttributeMaxDynamicSharedMemorySize, smC));
    { cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)n}, str[1] = {(cuuint64_t)k}; cuuint32_t box[2] = {128, 128}, es[2] = {1, 1};
      CUresult r = cuTensorMapEncodeTiled((CUtensorMap*)&tq, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, dA, dims, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      if (r) { printf("tq encode %d\n", r); exit(1); } }
    { cuuint64_t dims[2] = {(cuuint64_t)rb, (cuuint64_t)rows}, str[1] = {(cuuint64_t)rb}; cuuint32_t box[2] = {64, 128}, es[2] = {1, 1};
      CUresult r = cuTensorMapEncodeTiled((CUtensorMap*)&tw, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, dW, dims, str, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_64B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      if (r) { printf("tw encode %d\n", r); exit(1); } }
    auto run_old = [&]() { ternary_gemm<<<dim3((rows + 255) / 256, (n + 31) / 32), 256>>>(batch(o1, 256), k, dA, dD, dL, n); };
    auto run_a = [&]() { v_128_3_4<<<dim3((rows + 191) / 192, (n + 127) / 128), 416, smA>>>(batch(o3, 192), tq, tw192, k, dD, dL, n); };
    auto run_c = [&]() { v_128_2_5<<<dim3((rows + 127) / 128, (n + 127) / 128), 288, smC>>>(batch(o3, 128), tq, tw, k, dD, dL, n); };
    auto run_wg = [&]() { ternary_gemm_wg<<<dim3((rows + 64 * WG_CW - 1) / (64 * WG_CW), (n + WG_NT - 1) / WG_NT), WG_THREADS, sm128>>>(batch(o2, 64 * WG_CW), tq, twm, twm, twm, k, dD, dL, n); };
    CK(cudaMemset(o1, 0xff, on * 4)); CK(cudaMemset(o2, 0xff, on * 4)); CK(cudaMemset(o3, 0xff, on * 4));
    run_old(); run_wg(); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
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
    cmp("wg128", h2);
    for (int v = 0; v < 2; ++v) { CK(cudaMemset(o3, 0xff, on * 4)); if (v == 0) run_a(); else run_c(); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(h3.data(), o3, on * 4, cudaMemcpyDeviceToHost)); cmp(v == 0 ? "128x3x4" : "128x2x5", h3); }
    if (!cs.cpu) {
      cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
      auto timeit = [&](const char* name, auto fn) { for (int i = 0; i < 3; ++i) fn(); cudaEventRecord(e0); for (int i = 0; i < 20; ++i) fn(); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); double us = ms * 1000 / 20; printf("  %-6s %8.1f us  %6.0f TOPS\n", name, us, 2.0 * rows * k * (double)n / us / 1e6); };
      timeit("old", run_old); timeit("wg128", run_wg); timeit("128x3x4", run_a); timeit("128x2x5", run_c); timeit("old", run_old); timeit("wg128", run_wg);
    }
    cudaFree(dW); cudaFree(dA); cudaFree(dS); cudaFree(dD); cudaFree(dL); cudaFree(o1); cudaFree(o2); cudaFree(o3);
  }
  printf(fails ? "FAIL %d\n" : "ALL OK\n", fails);
  return fails != 0;
}
