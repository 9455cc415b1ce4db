"""The CUDA prelude every generated module starts with.

NVRTC from the pip wheels ships no headers (cuda_fp16.h is not found), so the prelude defines
what it needs itself: 16-bit float storage types with PTX conversions, type traits, the `sf_*`
helpers that the op registry's `cuda=` expressions call (PyTorch semantics where C differs),
atomics for every dtype (native where the hardware has them, compare-and-swap otherwise), warp
and block reductions, and the device-side error word.
"""

PRELUDE = r"""
// ---- segfuse prelude ---------------------------------------------------------------------
struct __align__(2) sf_half { unsigned short x; };
struct __align__(2) sf_bf16 { unsigned short x; };

__device__ __forceinline__ float sf_h2f(sf_half h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.x)); return f; }
__device__ __forceinline__ sf_half sf_f2h(float f) { sf_half h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.x) : "f"(f)); return h; }
__device__ __forceinline__ float sf_b2f(sf_bf16 b) { return __int_as_float(((int)b.x) << 16); }
__device__ __forceinline__ sf_bf16 sf_f2b(float f) { sf_bf16 b; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.x) : "f"(f)); return b; }

template <bool B, typename T = void> struct sf_enable_if {};
template <typename T> struct sf_enable_if<true, T> { typedef T type; };
template <typename T> struct sf_is_float { static const bool value = false; };
template <> struct sf_is_float<float> { static const bool value = true; };
template <> struct sf_is_float<double> { static const bool value = true; };
template <typename T> struct sf_is_same_bool { static const bool value = false; };
template <> struct sf_is_same_bool<bool> { static const bool value = true; };
template <typename T> struct sf_is_signed { static const bool value = ((T)-1) < (T)0; };

// Conversions: value <- value, storage <-> value. Floats to integers truncate (C), to bool test != 0.
template <typename To, typename From> struct sf_cvt_t { __device__ static To f(From x) { return (To)x; } };
template <typename From> struct sf_cvt_t<bool, From> { __device__ static bool f(From x) { return x != (From)0; } };
template <> struct sf_cvt_t<bool, bool> { __device__ static bool f(bool x) { return x; } };
template <typename From> struct sf_cvt_t<sf_half, From> { __device__ static sf_half f(From x) { return sf_f2h((float)x); } };
template <typename From> struct sf_cvt_t<sf_bf16, From> { __device__ static sf_bf16 f(From x) { return sf_f2b((float)x); } };
template <typename To> struct sf_cvt_t<To, sf_half> { __device__ static To f(sf_half x) { return sf_cvt_t<To, float>::f(sf_h2f(x)); } };
template <typename To> struct sf_cvt_t<To, sf_bf16> { __device__ static To f(sf_bf16 x) { return sf_cvt_t<To, float>::f(sf_b2f(x)); } };
template <> struct sf_cvt_t<sf_half, sf_half> { __device__ static sf_half f(sf_half x) { return x; } };
template <> struct sf_cvt_t<sf_bf16, sf_bf16> { __device__ static sf_bf16 f(sf_bf16 x) { return x; } };
template <> struct sf_cvt_t<sf_half, sf_bf16> { __device__ static sf_half f(sf_bf16 x) { return sf_f2h(sf_b2f(x)); } };
template <> struct sf_cvt_t<sf_bf16, sf_half> { __device__ static sf_bf16 f(sf_half x) { return sf_f2b(sf_h2f(x)); } };
template <> struct sf_cvt_t<bool, sf_half> { __device__ static bool f(sf_half x) { return sf_h2f(x) != 0.f; } };
template <> struct sf_cvt_t<bool, sf_bf16> { __device__ static bool f(sf_bf16 x) { return sf_b2f(x) != 0.f; } };
// float -> narrower integer goes through int64 so out-of-range values wrap like NumPy/PyTorch's
// CPU casts (-1.0 -> uint8 255) instead of saturating like the GPU's cvt instruction
#define SF_F2I(F, I) template <> struct sf_cvt_t<I, F> { __device__ static I f(F x) { return (I)(long long)x; } };
SF_F2I(float, unsigned char) SF_F2I(float, signed char) SF_F2I(float, short) SF_F2I(float, int)
SF_F2I(double, unsigned char) SF_F2I(double, signed char) SF_F2I(double, short) SF_F2I(double, int)
#undef SF_F2I
template <typename To, typename From> __device__ __forceinline__ To sf_cvt(From x) { return sf_cvt_t<To, From>::f(x); }

__device__ __forceinline__ double sf_inf() { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ double sf_nan() { return __longlong_as_double(0x7ff8000000000000LL); }

// ---- error word: [code, op position, bad value, dim, size]; the first failure wins ------------
__device__ __noinline__ void sf_fail(long long* err, long long code, long long op, long long value,
                                     long long dim, long long size) {
  if (atomicCAS((unsigned long long*)err, 0ULL, (unsigned long long)code) == 0ULL) {
    err[1] = op; err[2] = value; err[3] = dim; err[4] = size;
  }
}
template <typename T> __device__ __forceinline__ T sf_nz(T b, long long* err, long long op) {
  if (b == (T)0) { sf_fail(err, 2, op, 0, 1, 0); return (T)1; }
  return b;
}
template <typename T> __device__ __forceinline__ T sf_nonneg(T b, long long* err, long long op) {
  if (b < (T)0) { sf_fail(err, 3, op, (long long)b, 1, 0); return (T)0; }
  return b;
}

// ---- pointwise helpers (PyTorch semantics) ---------------------------------------------------
template <typename T> __device__ __forceinline__ T sf_abs(T x) { return x < (T)0 ? (T)-x : x; }
__device__ __forceinline__ float sf_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double sf_abs(double x) { return fabs(x); }
__device__ __forceinline__ bool sf_abs(bool x) { return x; }
template <typename T> __device__ __forceinline__ T sf_sigmoid(T x) { return (T)1 / ((T)1 + exp(-x)); }
template <typename T> __device__ __forceinline__ T sf_relu(T x) { return (x > (T)0 || x != x) ? x : (T)0; }
template <typename T> __device__ __forceinline__ T sf_silu(T x) { return x / ((T)1 + exp(-x)); }
__device__ __forceinline__ float sf_gelu(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ double sf_gelu(double x) { return 0.5 * x * (1.0 + erf(x * 0.70710678118654752)); }
template <typename T> __device__ __forceinline__ T sf_floor(T x) { return x; }
__device__ __forceinline__ float sf_floor(float x) { return floorf(x); }
__device__ __forceinline__ double sf_floor(double x) { return floor(x); }
template <typename T> __device__ __forceinline__ T sf_ceil(T x) { return x; }
__device__ __forceinline__ float sf_ceil(float x) { return ceilf(x); }
__device__ __forceinline__ double sf_ceil(double x) { return ceil(x); }
template <typename T> __device__ __forceinline__ T sf_round(T x) { return x; }
__device__ __forceinline__ float sf_round(float x) { return rintf(x); }
__device__ __forceinline__ double sf_round(double x) { return rint(x); }
template <typename T> __device__ __forceinline__ T sf_trunc(T x) { return x; }
__device__ __forceinline__ float sf_trunc(float x) { return truncf(x); }
__device__ __forceinline__ double sf_trunc(double x) { return trunc(x); }
template <typename T> __device__ __forceinline__ T sf_sign(T x) { return (T)((x > (T)0) - (x < (T)0)); }
__device__ __forceinline__ bool sf_sign(bool x) { return x; }
__device__ __forceinline__ float sf_sign(float x) { return x != x ? x : (float)((x > 0.f) - (x < 0.f)); }
__device__ __forceinline__ double sf_sign(double x) { return x != x ? x : (double)((x > 0.0) - (x < 0.0)); }
template <typename T> __device__ __forceinline__ T sf_bitnot(T x) { return (T)~x; }
__device__ __forceinline__ bool sf_bitnot(bool x) { return !x; }
template <typename T> __device__ __forceinline__ bool sf_isnan(T x) { return x != x; }
template <typename T> __device__ __forceinline__ bool sf_isinf(T x) { return sf_is_float<T>::value && (x == (T)sf_inf() || x == (T)-sf_inf()); }
template <typename T> __device__ __forceinline__ bool sf_isfinite(T x) { return !sf_isnan(x) && !sf_isinf(x); }
template <typename T> __device__ __forceinline__ T sf_add(T a, T b) { return (T)(a + b); }
__device__ __forceinline__ bool sf_add(bool a, bool b) { return a || b; }
template <typename T> __device__ __forceinline__ T sf_mul(T a, T b) { return (T)(a * b); }
__device__ __forceinline__ bool sf_mul(bool a, bool b) { return a && b; }
template <typename T> __device__ __forceinline__ T sf_floordiv(T a, T b) {
  T q = (T)(a / b); if ((a % b != 0) && ((a < 0) != (b < 0))) q = (T)(q - 1); return q; }
template <typename T> __device__ __forceinline__ T sf_remainder(T a, T b) {
  T r = (T)(a % b); if (r != 0 && ((r < 0) != (b < 0))) r = (T)(r + b); return r; }
__device__ __forceinline__ float sf_remainder(float a, float b) { float r = fmodf(a, b); if (r != 0.f && ((r < 0.f) != (b < 0.f))) r += b; return r; }
__device__ __forceinline__ double sf_remainder(double a, double b) { double r = fmod(a, b); if (r != 0.0 && ((r < 0.0) != (b < 0.0))) r += b; return r; }
template <typename T> __device__ __forceinline__ T sf_fmod(T a, T b) { return (T)(a % b); }
__device__ __forceinline__ float sf_fmod(float a, float b) { return fmodf(a, b); }
__device__ __forceinline__ double sf_fmod(double a, double b) { return fmod(a, b); }
// floats: Python's floor division, as PyTorch's c10::div_floor_floating ((a - fmod(a, b)) / b, then
// the fix-ups), not floor(a / b), which rounds e.g. 1 // 0.1 up to 10; float16/bfloat16 come here as float
__device__ __forceinline__ float sf_copysign(float a, float b) { return copysignf(a, b); }
__device__ __forceinline__ double sf_copysign(double a, double b) { return copysign(a, b); }
template <typename F> __device__ __forceinline__ F sf_floordiv_float(F a, F b) {
  if (b == (F)0) return a / b;
  F m = sf_fmod(a, b), d = (a - m) / b;
  if (m != (F)0 && ((b < (F)0) != (m < (F)0))) d -= (F)1;
  if (d == (F)0) return sf_copysign((F)0, a / b);
  F q = sf_floor(d); return d - q > (F)0.5 ? q + (F)1 : q; }
__device__ __forceinline__ float sf_floordiv(float a, float b) { return sf_floordiv_float(a, b); }
__device__ __forceinline__ double sf_floordiv(double a, double b) { return sf_floordiv_float(a, b); }
template <typename T> __device__ __forceinline__ T sf_ceildiv(T a, T b) { return (T)(sf_floordiv(a, b) + (sf_remainder(a, b) != 0)); }
__device__ __forceinline__ float sf_ceildiv(float a, float b) { return ceilf(a / b); }
__device__ __forceinline__ double sf_ceildiv(double a, double b) { return ceil(a / b); }
template <typename T> __device__ __forceinline__ T sf_pow(T a, T b) {
  T r = 1; while (b > 0) { if (b & 1) r = (T)(r * a); a = (T)(a * a); b = (T)(b >> 1); } return r; }
__device__ __forceinline__ bool sf_pow(bool a, bool b) { return a || !b; }
__device__ __forceinline__ float sf_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double sf_pow(double a, double b) { return pow(a, b); }
template <typename T> __device__ __forceinline__ T sf_max(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a > b ? a : b)); }
template <typename T> __device__ __forceinline__ T sf_min(T a, T b) { return (a != a) ? a : ((b != b) ? b : (a < b ? a : b)); }
// float: one instruction (PTX max.NaN / min.NaN, sm_80+), NaN-propagating like the form above;
// a row's amax in softmax spent 5 instructions an element on the three-way select
__device__ __forceinline__ float sf_max(float a, float b) { float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
__device__ __forceinline__ float sf_min(float a, float b) { float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
template <typename T> __device__ __forceinline__ T sf_shl(T a, T b) {
  const int bits = sizeof(T) * 8; return (b < 0 || b >= bits) ? (T)0 : (T)(a << b); }
template <typename T> __device__ __forceinline__ T sf_shr(T a, T b) {
  const int bits = sizeof(T) * 8; return (b < 0 || b >= bits) ? (T)(a < 0 ? -1 : 0) : (T)(a >> b); }
template <typename T> __device__ __forceinline__ T sf_lerp(T s, T e, T w) {
  T d = e - s; return (w < (T)0.5 && w > (T)-0.5) ? s + w * d : e - d * ((T)1 - w); }

// NaN-aware ordering used by sorts: NaN after +inf (PyTorch).
template <typename T> __device__ __forceinline__ bool sf_less(T a, T b) { return a < b || (a == a && b != b); }

// ---- atomics --------------------------------------------------------------------------------
template <int N> struct sf_word {};
template <> struct sf_word<4> { typedef unsigned int type; };
template <> struct sf_word<8> { typedef unsigned long long type; };

// Apply `f(old) -> new` atomically to *addr for any storage type (sub-word types CAS the 32-bit word).
template <typename T, typename F> __device__ __forceinline__ void sf_atomic_apply(T* addr, F f) {
  if (sizeof(T) == 4 || sizeof(T) == 8) {
    typedef typename sf_word<(sizeof(T) == 8 ? 8 : 4)>::type W;
    W* wp = (W*)addr;
    W old = *wp, assumed;
    do {
      assumed = old;
      union { W w; T t; } u; u.w = assumed;
      union { W w; T t; } v; v.w = 0; v.t = f(u.t);
      if (v.w == assumed) return;
      old = atomicCAS(wp, assumed, v.w);
    } while (old != assumed);
  } else {
    size_t a = (size_t)addr;
    unsigned int* wp = (unsigned int*)(a & ~(size_t)3);
    const int shift = (int)(a & 3) * 8;
    const unsigned int mask = (sizeof(T) == 1 ? 0xffu : 0xffffu) << shift;
    unsigned int old = *wp, assumed;
    do {
      assumed = old;
      union { unsigned short s; unsigned char c; T t; } u; u.s = 0;
      if (sizeof(T) == 1) u.c = (unsigned char)((assumed & mask) >> shift); else u.s = (unsigned short)((assumed & mask) >> shift);
      union { unsigned short s; unsigned char c; T t; } v; v.s = 0; v.t = f(u.t);
      unsigned int nv = (assumed & ~mask) | ((sizeof(T) == 1 ? (unsigned int)v.c : (unsigned int)v.s) << shift);
      if (nv == assumed) return;
      old = atomicCAS(wp, assumed, nv);
    } while (old != assumed);
  }
}

// Combine in the value domain W, store in S. One struct per reduce; `atomic` picks native atomics.
struct sf_op_add {
  template <typename W> __device__ static W id() { return (W)0; }
  template <typename W> __device__ static W f(W a, W b) { return sf_add(a, b); }
};
struct sf_op_mul {
  template <typename W> __device__ static W id() { return (W)1; }
  template <typename W> __device__ static W f(W a, W b) { return sf_mul(a, b); }
};
template <typename W> __device__ __forceinline__ W sf_lowest() {
  return sf_is_float<W>::value ? (W)-sf_inf() : (sf_is_same_bool<W>::value ? (W)0 : (sf_is_signed<W>::value ? (W)(((unsigned long long)1) << (sizeof(W) * 8 - 1)) : (W)0)); }
template <typename W> __device__ __forceinline__ W sf_highest() {
  return sf_is_float<W>::value ? (W)sf_inf() : (sf_is_same_bool<W>::value ? (W)1 : (sf_is_signed<W>::value ? (W)(~(((unsigned long long)1) << (sizeof(W) * 8 - 1))) : (W)~0ULL)); }
struct sf_op_amax {
  template <typename W> __device__ static W id() { return sf_lowest<W>(); }
  template <typename W> __device__ static W f(W a, W b) { return sf_max(a, b); }
};
struct sf_op_amin {
  template <typename W> __device__ static W id() { return sf_highest<W>(); }
  template <typename W> __device__ static W f(W a, W b) { return sf_min(a, b); }
};

template <typename Op, typename S, typename W> __device__ __forceinline__ void sf_atomic(S* p, W v) {
  sf_atomic_apply(p, [&](S old) { return sf_cvt<S>(Op::f(sf_cvt<W>(old), v)); });
}
// Native fast paths.
template <> __device__ __forceinline__ void sf_atomic<sf_op_add, float, float>(float* p, float v) { atomicAdd(p, v); }
template <> __device__ __forceinline__ void sf_atomic<sf_op_add, double, double>(double* p, double v) { atomicAdd(p, v); }
template <> __device__ __forceinline__ void sf_atomic<sf_op_add, int, int>(int* p, int v) { atomicAdd(p, v); }
template <> __device__ __forceinline__ void sf_atomic<sf_op_add, long long, long long>(long long* p, long long v) {
  atomicAdd((unsigned long long*)p, (unsigned long long)v); }
template <> __device__ __forceinline__ void sf_atomic<sf_op_amax, int, int>(int* p, int v) { atomicMax(p, v); }
template <> __device__ __forceinline__ void sf_atomic<sf_op_amin, int, int>(int* p, int v) { atomicMin(p, v); }
template <> __device__ __forceinline__ void sf_atomic<sf_op_amax, long long, long long>(long long* p, long long v) { atomicMax(p, v); }
template <> __device__ __forceinline__ void sf_atomic<sf_op_amin, long long, long long>(long long* p, long long v) { atomicMin(p, v); }
// Plain store for scatter without reduce.
struct sf_op_none {};

// ---- warp / block reductions and scans -------------------------------------------------------
template <typename T> __device__ __forceinline__ T sf_shfl_down(T v, int d) {
  const int W = (sizeof(T) + 3) / 4;
  union { T t; int w[(sizeof(T) + 3) / 4]; } u; u.t = v;
  for (int i = 0; i < W; ++i) u.w[i] = __shfl_down_sync(0xffffffffu, u.w[i], d);
  return u.t;
}
template <typename T> __device__ __forceinline__ T sf_shfl_up(T v, int d) {
  const int W = (sizeof(T) + 3) / 4;
  union { T t; int w[(sizeof(T) + 3) / 4]; } u; u.t = v;
  for (int i = 0; i < W; ++i) u.w[i] = __shfl_up_sync(0xffffffffu, u.w[i], d);
  return u.t;
}
template <typename T> __device__ __forceinline__ T sf_shfl(T v, int src) {
  const int W = (sizeof(T) + 3) / 4;
  union { T t; int w[(sizeof(T) + 3) / 4]; } u; u.t = v;
  for (int i = 0; i < W; ++i) u.w[i] = __shfl_sync(0xffffffffu, u.w[i], src);
  return u.t;
}
template <typename T, typename F> __device__ __forceinline__ T sf_warp_reduce(T v, F f) {
  for (int d = 16; d > 0; d >>= 1) v = f(v, sf_shfl_down(v, d));
  return v;
}
// Block-wide reduction; every thread gets the result. Needs all threads of the block.
template <typename T, typename F> __device__ __forceinline__ T sf_block_reduce(T v, F f) {
  __shared__ __align__(16) unsigned char raw[33 * 16];
  T* sh = (T*)raw;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = sf_warp_reduce(v, f);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T x = lane < nw ? sh[lane] : sh[0];
    for (int d = 16; d > 0; d >>= 1) { T y = sf_shfl_down(x, d); if (lane + d < nw) x = f(x, y); }
    if (lane == 0) sh[32] = x;
  }
  __syncthreads();
  return sh[32];
}
// Block-wide inclusive scan of one value per thread; `total` gets the block's total.
template <typename T, typename F> __device__ __forceinline__ T sf_block_scan(T v, F f, T& total) {
  __shared__ __align__(16) unsigned char raw[33 * 16];
  T* sh = (T*)raw;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  for (int d = 1; d < 32; d <<= 1) { T y = sf_shfl_up(v, d); if (lane >= d) v = f(y, v); }
  __syncthreads();
  if (lane == 31 || threadIdx.x == blockDim.x - 1) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T x = lane < nw ? sh[lane] : sh[0];
    for (int d = 1; d < 32; d <<= 1) { T y = sf_shfl_up(x, d); if (lane >= d) x = f(y, x); }
    if (lane < nw) sh[lane] = x;
  }
  __syncthreads();
  if (warp > 0) v = f(sh[warp - 1], v);
  total = sh[nw - 1];
  __syncthreads();
  return v;
}
template <typename T> struct alignas(sizeof(T) * 4) sf_v4 { T v[4]; };
// Plain 16-byte vector accesses: on an H200, evict-first hints (__ldcs/__stcs) made the 2^28-float
// chain 7% slower (1030 vs 964 us back to back; benchmarks/README.md, 2026-11-29 23:40 probe)
template <typename T> __device__ __forceinline__ sf_v4<T> sf_vload(const sf_v4<T>* p) { return *p; }
template <typename T> __device__ __forceinline__ void sf_vstore(sf_v4<T>* p, sf_v4<T> v) { *p = v; }
template <typename V> struct sf_argpair { V v; long long i; };
// ---- end of prelude -------------------------------------------------------------------------
"""


# Emitted before a module's kernels only when one of them uses it (CodegenOptions.row_one_barrier), so the
# modules that do not keep their sources (and digests).
BLOCK_REDUCE1 = r"""
// sf_block_reduce with one barrier instead of three: each warp writes its partial to buffer `par` (0 or 1) and then every
// warp combines all the partials itself. A buffer is written again only two calls later, after a
// barrier every thread reaches once it has read it; the caller alternates `par` between calls.
template <typename T, typename F> __device__ __forceinline__ T sf_block_reduce1(T v, F f, int par) {
  __shared__ __align__(16) unsigned char raw[2 * 32 * 16];
  T* sh = (T*)raw + par * 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = sf_warp_reduce(v, f);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  T x = lane < nw ? sh[lane] : sh[0];
  for (int d = 16; d > 0; d >>= 1) { T y = sf_shfl_down(x, d); if (lane + d < nw) x = f(x, y); }
  return sf_shfl(x, 0);
}
"""


# sf_block_reduce1 for a block of NW warps known when the kernel is generated (CodegenOptions.row_reduce_butterfly).
BLOCK_REDUCE1_BUTTERFLY = r"""
// sf_block_reduce1 for NW warps (a power of two), known at compile time: after the one barrier lane i
// reads partial i % NW and the warp combines them in a butterfly (shfl.bfly, as Triton's reductions do).
// Each step combines a pair both ways and f commutes, so every lane ends with the same value: no
// broadcast after it and no predicate in it.
template <typename T> __device__ __forceinline__ T sf_shfl_xor(T v, int d) {
  const int W = (sizeof(T) + 3) / 4;
  union { T t; int w[(sizeof(T) + 3) / 4]; } u; u.t = v;
  for (int i = 0; i < W; ++i) u.w[i] = __shfl_xor_sync(0xffffffffu, u.w[i], d);
  return u.t;
}
template <int NW, typename T, typename F> __device__ __forceinline__ T sf_block_reduce1w(T v, F f, int par) {
  static_assert(NW >= 1 && NW <= 32 && (NW & (NW - 1)) == 0, "NW: a power of two up to 32");
  __shared__ __align__(16) unsigned char raw[2 * 32 * 16];
  T* sh = (T*)raw + par * 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = sf_warp_reduce(v, f);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  T x = sh[lane & (NW - 1)];
  #pragma unroll
  for (int d = NW / 2; d > 0; d >>= 1) x = f(x, sf_shfl_xor(x, d));
  return x;
}
"""


# Emitted only where a kernel loads with it (row_reduction.py, rows in registers), so other
# modules keep their sources (and digests).
VLOAD_LAST = r"""
// Vector loads with L1 and L2 evict-last priority (ld.global.L1::evict_last.L2::cache_hint, an
// L2 policy from createpolicy): the hints torch.compile's Triton kernels give a row's first read.
// On the H200 a row held in registers and loaded this way ran 2-6% faster at 32768 rows
// (limits.ROW_LOAD_HINTS); evict-first hints made it 3-5% slower (norm_variants.py NORM_CACHE=l2).
__device__ __forceinline__ unsigned long long sf_policy_last() {
  unsigned long long p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
  return p;
}
template <int W> __device__ __forceinline__ void sf_ld_last(const unsigned* p, unsigned* u, unsigned long long pol);
template <> __device__ __forceinline__ void sf_ld_last<1>(const unsigned* p, unsigned* u, unsigned long long pol) {
  asm volatile("ld.global.L1::evict_last.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(u[0]) : "l"(p), "l"(pol));
}
template <> __device__ __forceinline__ void sf_ld_last<2>(const unsigned* p, unsigned* u, unsigned long long pol) {
  asm volatile("ld.global.L1::evict_last.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;" : "=r"(u[0]), "=r"(u[1]) : "l"(p), "l"(pol));
}
template <> __device__ __forceinline__ void sf_ld_last<4>(const unsigned* p, unsigned* u, unsigned long long pol) {
  asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;" : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3]) : "l"(p), "l"(pol));
}
template <> __device__ __forceinline__ void sf_ld_last<8>(const unsigned* p, unsigned* u, unsigned long long pol) {
  sf_ld_last<4>(p, u, pol);
  sf_ld_last<4>(p + 4, u + 4, pol);
}
template <typename T> __device__ __forceinline__ sf_v4<T> sf_vload_last(const sf_v4<T>* p) {
  sf_v4<T> r;
  sf_ld_last<sizeof(sf_v4<T>) / 4>((const unsigned*)p, (unsigned*)&r, sf_policy_last());
  return r;
}
"""


# Emitted only when a kernel splits its rows over a thread-block cluster (codegen/row_reduction.py,
# limits.row_split); sm_90's cluster barrier and distributed shared memory, in PTX (CUDA's
# cooperative_groups::cluster_group does the same through headers NVRTC does not ship).
CLUSTER_REDUCE = r"""
// Every thread of every block of the cluster: arrive, then wait (release, then acquire: the
// shared-memory writes before it are visible to the cluster's blocks after it).
__device__ __forceinline__ void sf_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// *p (a __shared__ variable of this block) in block `rank` of the cluster: mapa gives its generic
// address there.
template <typename T> __device__ __forceinline__ T sf_cluster_ld(const T* p, unsigned rank) {
  unsigned long long q;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(q) : "l"((unsigned long long)p), "r"(rank));
  return *(const T*)q;
}
// The cluster-wide reduction of `v` (the block's reduction, every thread holding it): thread 0
// puts it in the block's `slot`, and after the cluster barrier every thread combines the n blocks'
// slots in rank order, so every block computes the same value. The caller reaches a second
// cluster barrier before a slot is written again or a block exits (its slots read by the others).
template <typename T, typename F> __device__ __forceinline__ T sf_cluster_reduce(T v, F f, T* slot, unsigned n) {
  static_assert(sizeof(T) <= 16, "a cluster slot holds 16 bytes");
  if (threadIdx.x == 0) *slot = v;
  sf_cluster_sync();
  T acc = sf_cluster_ld(slot, 0u);
  for (unsigned r = 1; r < n; ++r) acc = f(acc, sf_cluster_ld(slot, r));
  return acc;
}
"""


# The parts segment.py emits only into modules that use them: (what a kernel that uses it calls,
# the part), in the order they come before the kernels
OPTIONAL_PARTS = (("sf_vload_last(", VLOAD_LAST), ("sf_cluster_reduce(", CLUSTER_REDUCE), ("sf_block_reduce1(", BLOCK_REDUCE1),
                  ("sf_block_reduce1w<", BLOCK_REDUCE1_BUTTERFLY))


def one_program(sources) -> str:
    """Many generated modules as one NVRTC program (the tests compile thousands in batches): the
    prelude and each optional part once, then every module's kernels (their names are hashes of
    their bodies, so they do not clash)."""
    used, bodies = [], []
    for src in sources:
        body = src[len(PRELUDE):]
        for _, part in OPTIONAL_PARTS:
            if part + "\n" in body:
                body = body.replace(part + "\n", "")
                if part not in used:
                    used.append(part)
        bodies.append(body)
    return PRELUDE + "".join(p + "\n" for _, p in OPTIONAL_PARTS if p in used) + "".join(bodies)
