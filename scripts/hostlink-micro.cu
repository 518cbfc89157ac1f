// Round-trip costs of the host link for one hybrid split, measured from the
// host as a decoding step sees them: the host writes an activation row into
// pinned memory, launches a captured graph that brings it in, runs a small
// kernel and sends a row back into mapped host memory, then waits.
// Build and run on the device machine:
//   nvcc -O2 -arch=sm_90 -o /tmp/hl scripts/hostlink-micro.cu -lcuda && /tmp/hl
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <vector>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t err_ = (x); if (err_ != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(err_)); exit(1); } } while (0)

constexpr int N = 2560;          // floats in a row: 10 KB
constexpr int BIG = 128256;      // logits: 513 KB
constexpr int ITERS = 3000;

__global__ void add(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

// The same add, reading b as 16-byte words straight from mapped host memory.
__global__ void add_from_host(const float4* a, const float4* b_host, float4* out, int n4) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        float4 x = a[i], y = b_host[i];
        out[i] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    }
}

__global__ void copy16(const uint4* src, uint4* dst, int n16) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n16) dst[i] = src[i];
}

// The export, then a flag the host polls: every thread's write is made
// visible to the host before one thread raises the flag.
__global__ void copy16_flag(const uint4* src, uint4* dst, int n16, volatile unsigned* flag, unsigned v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n16) dst[i] = src[i];
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned done = atomicAdd((unsigned*)flag + 1, 1) + 1;
        if (done == gridDim.x) {
            flag[1] = 0;
            __threadfence_system();
            flag[0] = v;
        }
    }
}

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void* pinned(size_t bytes, void** dev) {
    void* p = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    memset(p, 0, bytes);
    CK(cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    CK(cudaHostGetDevicePointer(dev, p, 0));
    return p;
}

struct Stat { const char* name; double med, p10, p90; };
static std::vector<Stat> stats;

template <class F> static void bench(const char* name, F&& step) {
    for (int i = 0; i < 200; i++) step(i);
    std::vector<double> t(ITERS);
    for (int i = 0; i < ITERS; i++) {
        double a = now_us();
        step(i);
        t[i] = now_us() - a;
    }
    std::sort(t.begin(), t.end());
    stats.push_back({name, t[ITERS / 2], t[ITERS / 10], t[ITERS * 9 / 10]});
}

int main() {
    cudaStream_t s;
    CK(cudaSetDeviceFlags(cudaDeviceMapHost | cudaDeviceScheduleSpin));
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    float *x, *y, *tmp, *big;
    CK(cudaMalloc(&x, N * 4)); CK(cudaMalloc(&y, N * 4)); CK(cudaMalloc(&tmp, N * 4)); CK(cudaMalloc(&big, BIG * 4));
    CK(cudaMemset(x, 0, N * 4)); CK(cudaMemset(big, 0, BIG * 4));
    void *in_d, *out_d, *flag_d, *bigh_d;
    float* in_h = (float*)pinned(N * 4, &in_d);
    float* out_h = (float*)pinned(N * 4, &out_d);
    unsigned* flag_h = (unsigned*)pinned(64, &flag_d);
    float* bigh = (float*)pinned(BIG * 4, &bigh_d);
    std::vector<float> pageable(BIG);
    const int n16 = N * 4 / 16, blocks = (n16 + 255) / 256;

    auto capture = [&](auto&& body) {
        cudaGraph_t g; cudaGraphExec_t e;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        body();
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&e, g, 0));
        return e;
    };
    auto host_work = [&](int i) { for (int k = 0; k < N; k++) in_h[k] = (float)(i + k); };

    // Baseline: an empty-ish graph (one add on device rows) and a stream sync.
    auto g_none = capture([&] { add<<<(N + 255) / 256, 256, 0, s>>>(x, y, tmp, N); });
    bench("graph: add only, sync", [&](int i) { host_work(i); CK(cudaGraphLaunch(g_none, s)); CK(cudaStreamSynchronize(s)); });

    // As tern does it: DMA node in, add, copy kernel out to mapped memory.
    auto g_dma = capture([&] {
        CK(cudaMemcpyAsync(y, in_h, N * 4, cudaMemcpyHostToDevice, s));
        add<<<(N + 255) / 256, 256, 0, s>>>(x, y, tmp, N);
        copy16<<<blocks, 256, 0, s>>>((uint4*)tmp, (uint4*)out_d, n16);
    });
    bench("graph: DMA in, add, kernel out", [&](int i) { host_work(i); CK(cudaGraphLaunch(g_dma, s)); CK(cudaStreamSynchronize(s)); });

    // The add reads the host row itself.
    auto g_zc = capture([&] {
        add_from_host<<<(N / 4 + 127) / 128, 128, 0, s>>>((float4*)x, (float4*)in_d, (float4*)tmp, N / 4);
        copy16<<<blocks, 256, 0, s>>>((uint4*)tmp, (uint4*)out_d, n16);
    });
    bench("graph: add reads host, kernel out", [&](int i) { host_work(i); CK(cudaGraphLaunch(g_zc, s)); CK(cudaStreamSynchronize(s)); });

    // The copy in as a stream copy before the graph.
    auto g_nocopy = capture([&] {
        add<<<(N + 255) / 256, 256, 0, s>>>(x, y, tmp, N);
        copy16<<<blocks, 256, 0, s>>>((uint4*)tmp, (uint4*)out_d, n16);
    });
    bench("stream DMA in, graph: add, kernel out", [&](int i) {
        host_work(i);
        CK(cudaMemcpyAsync(y, in_h, N * 4, cudaMemcpyHostToDevice, s));
        CK(cudaGraphLaunch(g_nocopy, s));
        CK(cudaStreamSynchronize(s));
    });

    // The host polls a flag instead of synchronizing the stream.
    cudaGraphExec_t g_flag;
    {
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        CK(cudaMemcpyAsync(y, in_h, N * 4, cudaMemcpyHostToDevice, s));
        add<<<(N + 255) / 256, 256, 0, s>>>(x, y, tmp, N);
        cudaGraph_t g;
        // The host clears the flag before each launch; the graph sets it to 1.
        copy16_flag<<<blocks, 256, 0, s>>>((uint4*)tmp, (uint4*)out_d, n16, (unsigned*)flag_d, 1);
        CK(cudaStreamEndCapture(s, &g));
        CK(cudaGraphInstantiate(&g_flag, g, 0));
    }
    bench("graph: DMA in, add, kernel out + flag poll", [&](int i) {
        host_work(i);
        ((volatile unsigned*)flag_h)[0] = 0;
        CK(cudaGraphLaunch(g_flag, s));
        while (((volatile unsigned*)flag_h)[0] == 0) {}
    });
    CK(cudaStreamSynchronize(s));

    // Logits readback, 513 KB.
    bench("readback: pageable DtoH", [&](int) { CK(cudaMemcpy(pageable.data(), big, BIG * 4, cudaMemcpyDeviceToHost)); });
    bench("readback: pinned DMA + memcpy", [&](int) {
        CK(cudaMemcpyAsync(bigh, big, BIG * 4, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        memcpy(pageable.data(), bigh, BIG * 4);
    });
    bench("readback: copy kernel to mapped + memcpy", [&](int) {
        copy16<<<(BIG * 4 / 16 + 255) / 256, 256, 0, s>>>((uint4*)big, (uint4*)bigh_d, BIG * 4 / 16);
        CK(cudaStreamSynchronize(s));
        memcpy(pageable.data(), bigh, BIG * 4);
    });
    auto g_rb = capture([&] { CK(cudaMemcpyAsync(bigh, big, BIG * 4, cudaMemcpyDeviceToHost, s)); });
    bench("readback: DMA node in graph + memcpy", [&](int) {
        CK(cudaGraphLaunch(g_rb, s));
        CK(cudaStreamSynchronize(s));
        memcpy(pageable.data(), bigh, BIG * 4);
    });
    CK(cudaGetLastError());

    // Check the zero-copy path computed the sum the host wrote.
    host_work(7);
    CK(cudaGraphLaunch(g_zc, s));
    CK(cudaStreamSynchronize(s));
    float want = (float)(7 + 100);
    printf("check: out[100] = %g (want %g)\n", out_h[100], want);

    printf("%-46s %9s %9s %9s\n", "round trip (µs, from the host)", "median", "p10", "p90");
    for (auto& st : stats) printf("%-46s %9.2f %9.2f %9.2f\n", st.name, st.med, st.p10, st.p90);
    return 0;
}
