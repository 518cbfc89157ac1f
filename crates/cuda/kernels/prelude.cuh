// Shared by every kernel file: fixed-width types, half conversions without
// headers (NVRTC has none by default), warp reductions, and the programmatic
// dependent launch hooks.
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// ggml type ids the kernels understand.
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q8_0 8
#define T_Q6_K 14
#define T_BF16 30

#define INFINITY __int_as_float(0x7f800000)

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf2f(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}

__device__ __forceinline__ u16 ld_u16(const u8* p) {
    return (u16)p[0] | ((u16)p[1] << 8);
}

// Reductions over a warp and over a block (blockDim.x a multiple of 32,
// ≤ 1024; every thread gets the result). `identity` fills the lanes past the
// block's warp count in the second step.
struct Sum {
    template <typename T>
    __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};

struct Max {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T* scratch, T identity, Op op) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : identity;
    return warp_reduce(v, op);
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, Sum()); }
__device__ __forceinline__ int warp_sum_i(int v) { return warp_reduce(v, Sum()); }
__device__ __forceinline__ float warp_max(float v) { return warp_reduce(v, Max()); }
__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce(v, scratch, 0.0f, Sum()); }
__device__ __forceinline__ float block_max(float v, float* scratch) { return block_reduce(v, scratch, 0.0f, Max()); }

// Programmatic dependent launch (sm_90+): wait for the previous kernel's
// results, and let the next kernel be scheduled early. Both are no-ops when a
// kernel was launched without the attribute.
// Brings `bytes` from `p` into L1, a 128-byte line at a time: a hint that
// takes no registers and does not wait.
__device__ __forceinline__ void prefetch_l1(const void* p, int bytes) {
    for (int o = 0; o < bytes; o += 128) asm volatile("prefetch.global.L1 [%0];" ::"l"((const char*)p + o));
}

__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// The rotation of one pair (i of n_rot/2) at position pos, in double like the
// CPU reference so long positions keep their precision.
__device__ __forceinline__ void rope_angle(int pos, int i, int n_rot, float base, float fscale, const float* factors,
                                           double* c, double* s) {
    double f = pow((double)base, -2.0 * i / n_rot) * (double)fscale;
    if (factors) f /= (double)factors[i];
    sincos((double)pos * f, s, c);
}

// The same under YaRN (RopeParams::yarn), as tern_cpu's rope.rs `pair_freqs`
// computes it: pair i's frequency blends the interpolated one (× fscale) and
// the extrapolated one by `ext` times a ramp that falls from 1 to 0 between
// pair indices `low` and `high` (the corr dims the host computes), and cos and
// sin carry `mag`.
__device__ __forceinline__ void rope_angle_yarn(int pos, int i, int n_rot, float base, float fscale,
                                                const float* factors, float low, float high, float ext, float mag,
                                                double* c, double* s) {
    double extrap = pow((double)base, -2.0 * i / n_rot);
    if (factors) extrap /= (double)factors[i];
    double interp = extrap * (double)fscale;
    double y = ((double)i - (double)low) / fmax((double)high - (double)low, 0.001);
    double mix = (1.0 - fmin(fmax(y, 0.0), 1.0)) * (double)ext;
    double f = interp * (1.0 - mix) + extrap * mix;
    sincos((double)pos * f, s, c);
    *c *= (double)mag;
    *s *= (double)mag;
}

// The integer codes kernels take as `int` parameters and table fields: the
// host's `#[repr(i32)]` enums in tern_cuda::args (a host test compares them).
enum Act { ACT_NONE = -1, ACT_SILU = 0, ACT_RELU2 = 1 };
enum RopeMode { ROPE_NORM = 0, ROPE_NEOX = 1 };
enum BinOp { BIN_ADD = 0, BIN_MUL = 1 };
enum Fused { FUSED_LEVELS = 0, FUSED_BLOCK = 1, FUSED_STATS = 2 };
enum Gating { GATE_SOFTMAX = 0, GATE_SIGMOID = 1 };

// The two dimensions of rotation pair i (of head_dim / 2): (2i, 2i+1) in
// ROPE_NORM, NeoX (i, i + n_rot/2) in ROPE_NEOX. Pairs past n_rot/2 are not rotated (the
// result is false) and cover the dimensions past n_rot two at a time.
__device__ __forceinline__ bool rope_pair(int i, int n_rot, int mode, int* a, int* b) {
    int half = n_rot / 2;
    if (i >= half) {
        *a = n_rot + 2 * (i - half);
        *b = *a + 1;
        return false;
    }
    *a = mode == ROPE_NORM ? 2 * i : i;
    *b = mode == ROPE_NORM ? 2 * i + 1 : i + half;
    return true;
}

// Rotation pair i of one head at position pos (the `rope` kernel's
// arithmetic, shared by the kernels that rotate as they copy): the pair's
// dimensions in *a, *b and their values in *ya, *yb; dimensions past n_rot
// pass through. YaRN's ramp where `y_ext` is not 0 or `y_mag` not 1,
// otherwise the plain angle, so ropes without YaRN keep their bits.
__device__ __forceinline__ void rope_rotate(const float* xh, int i, int pos, int n_rot, int mode, float base,
                                            float fscale, const float* factors, float y_low, float y_high,
                                            float y_ext, float y_mag, int* a, int* b, float* ya, float* yb) {
    if (!rope_pair(i, n_rot, mode, a, b)) {
        *ya = xh[*a];
        *yb = xh[*b];
        return;
    }
    double c, s;
    if (y_ext != 0.0f || y_mag != 1.0f)
        rope_angle_yarn(pos, i, n_rot, base, fscale, factors, y_low, y_high, y_ext, y_mag, &c, &s);
    else
        rope_angle(pos, i, n_rot, base, fscale, factors, &c, &s);
    double x0 = xh[*a], x1 = xh[*b];
    *ya = (float)(x0 * c - x1 * s);
    *yb = (float)(x0 * s + x1 * c);
}

// One element of a weight row in any of the float or block formats.
__device__ __forceinline__ float dq(const u8* row, int e, int type) {
    switch (type) {
    case T_F32: return ((const float*)row)[e];
    case T_F16: return h2f(((const u16*)row)[e]);
    case T_BF16: return bf2f(((const u16*)row)[e]);
    case T_Q8_0: {
        const u8* b = row + (e >> 5) * 34;
        return h2f(ld_u16(b)) * (float)(i8)b[2 + (e & 31)];
    }
    case T_Q4_0: {
        const u8* b = row + (e >> 5) * 18;
        int j = e & 31;
        int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
        return h2f(ld_u16(b)) * (float)(q - 8);
    }
    case T_Q6_K: {
        // 256 elements: ql[128], qh[64], scales[16] (i8), d (f16).
        const u8* b = row + (e >> 8) * 210;
        int i = e & 255, h = i >> 7, j = i & 127, l = j & 31, g = j >> 5;
        int lo = b[h * 64 + l + (g & 1) * 32];
        lo = (g >= 2) ? (lo >> 4) : (lo & 15);
        int hi = (b[128 + h * 32 + l] >> (2 * g)) & 3;
        int sc = (i8)b[192 + h * 8 + (l >> 4) + 2 * g];
        return h2f(ld_u16(b + 208)) * (float)sc * (float)((lo | (hi << 4)) - 32);
    }
    }
    return 0.0f;
}

// act(gate) · up: ACT_SILU or ACT_RELU2. Every kernel that gates uses this one
// definition, so a fused product is bit for bit the separate launch's.
__device__ __forceinline__ float gated(float g, float up, int act) {
    float a = act == ACT_SILU ? g / (1.0f + expf(-g)) : fmaxf(g, 0.0f) * fmaxf(g, 0.0f);
    return a * up;
}
