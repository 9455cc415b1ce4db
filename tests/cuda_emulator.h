// The CUDA device API the generated kernels use, on the host: every CUDA thread is a fiber
// (ucontext) of one OS thread, switched at barriers, warp intrinsics and spin loads, so the
// threads of a warp run one by one between those points (code that skips a __syncwarp before
// reading another lane's shared-memory write sees stale data here too); shared memory is per
// block, warp intrinsics exchange through per-warp slots between two warp barriers.
// Included by tests/cuda_emulator.py before a kernel's source (which it rewrites a little: shared
// declarations, the prelude's few PTX lines). Test infrastructure only: no library runs CUDA C
// on a CPU (cuda4cpu and the like are unmaintained research code), and the GPU suite stays the
// judge of speed and of the memory model.
#pragma once
#include <setjmp.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <map>
#include <random>
#include <utility>
#include <type_traits>
#include <vector>

using std::isinf;
using std::isnan;

struct sfemu_dim3 { unsigned x, y, z; };
// CUDA's vector types (their alignment is their size, as on the GPU)
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((aligned(8))) int2 { int x, y; };
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(16))) double2 { double x, y; };
struct __attribute__((aligned(16))) longlong2 { long long x, y; };
struct __attribute__((aligned(16))) ulonglong2 { unsigned long long x, y; };

namespace sfemu {

struct Fiber;
inline thread_local Fiber* t_cur = nullptr;
inline thread_local jmp_buf t_sched;  // the scheduler, between two fibers
inline thread_local long t_progress = 0;  // barrier arrivals and exits: a round without any is a deadlock
void yield();

struct Barrier {  // exited threads count as arrived (a returned thread never blocks the rest)
    int size = 0, arrived = 0, exited = 0;
    long gen = 0;
    void wait() {
        ++t_progress;
        long g = gen;
        if (++arrived + exited >= size) { arrived = 0; ++gen; return; }
        while (gen == g) yield();
    }
    void leave() {
        ++exited;
        if (arrived > 0 && arrived + exited >= size) { arrived = 0; ++gen; }
    }
};

struct Warp {
    Barrier bar;
    unsigned long long slot[32];
};

struct Cluster;
struct Block {
    sfemu_dim3 idx;
    unsigned char* dyn = nullptr;
    size_t dyn_size = 0;
    Barrier bar;
    std::vector<Warp*> warps;
    std::map<std::pair<int, size_t>, void*> statics;  // (declaration, size): a template's instances apart
    int acc[2] = {0, 0};
    Cluster* cl = nullptr;
};
struct Cluster {  // a thread-block cluster: its blocks in rank order, one barrier for all their threads
    Barrier bar;
    std::vector<Block*> blocks;
};

inline thread_local sfemu_dim3 t_thread, t_block, t_bdim, t_gdim;
inline thread_local Block* t_blk = nullptr;

struct Fiber {  // entered the first time through its ucontext, later by _longjmp (no syscall)
    ucontext_t ctx;
    jmp_buf jb;
    bool started = false;
    void* stack;
    sfemu_dim3 tid;
    Block* blk;
    int calls = 0;  // __syncthreads_or's parity
    bool done = false;
};
inline void yield() {
    if (!_setjmp(t_cur->jb)) _longjmp(t_sched, 1);
}

inline unsigned char* dyn_smem() { return t_blk->dyn; }
inline void* static_smem_of(Block* b, int id, size_t size) {
    void*& p = b->statics[{id, size}];
    if (!p) { p = aligned_alloc(64, (size + 63) / 64 * 64); memset(p, 0, (size + 63) / 64 * 64); }
    return p;
}
inline void* static_smem(int id, size_t size) { return static_smem_of(t_blk, id, size); }
// barrier.cluster.arrive + wait: every thread of the cluster's blocks
inline void cluster_sync() { t_blk->cl->bar.wait(); }
// mapa: the address of this block's shared variable at `p` in block `rank` of the cluster
inline unsigned long long mapa(unsigned long long p, unsigned rank) {
    Block* to = t_blk->cl->blocks.at(rank);
    unsigned char* a = (unsigned char*)p;
    if (a >= t_blk->dyn && a < t_blk->dyn + t_blk->dyn_size) return (unsigned long long)(to->dyn + (a - t_blk->dyn));
    for (auto& kv : t_blk->statics) {
        unsigned char* b = (unsigned char*)kv.second;
        if (a >= b && a < b + kv.first.second)
            return (unsigned long long)((unsigned char*)static_smem_of(to, kv.first.first, kv.first.second) + (a - b));
    }
    abort();  // not a shared-memory address
}
inline int lane() { return (int)(t_thread.x & 31); }
inline Warp& warp() { return *t_blk->warps[t_thread.x >> 5]; }

template <typename T> inline T exchange(T v, int src, bool keep_own) {
    Warp& w = warp();
    unsigned long long bits = 0;
    memcpy(&bits, &v, sizeof(T));
    w.slot[lane()] = bits;
    w.bar.wait();
    T r = v;
    if (!keep_own) memcpy(&r, &w.slot[src], sizeof(T));
    w.bar.wait();
    return r;
}

inline float h2f(unsigned short h) {
    unsigned s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float f = e == 0 ? std::ldexp((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp((float)(m | 1024), (int)e - 25);
    return s ? -f : f;
}
inline unsigned short f2h(float f) {  // round to nearest even, as cvt.rn.f16.f32
    unsigned x; memcpy(&x, &f, 4);
    unsigned s = (x >> 16) & 0x8000u;
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)(s | 0x7e00u);
    float a = std::fabs(f);
    if (a >= 65520.f) return (unsigned short)(s | 0x7c00u);
    if (a < 6.103515625e-05f) {  // subnormal: multiples of 2^-24
        float q = std::nearbyint(a * 16777216.f);
        return (unsigned short)(s | (unsigned)q);
    }
    int e; float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    float q = std::nearbyint(m * 2048.f);  // 11 significant bits
    if (q >= 2048.f) { q /= 2; ++e; }
    unsigned he = (unsigned)(e + 14), hm = (unsigned)q - 1024u;
    if (he >= 31) return (unsigned short)(s | 0x7c00u);
    return (unsigned short)(s | (he << 10) | hm);
}
inline unsigned short f2b(float f) {
    unsigned x; memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (unsigned short)(x >> 16);
}
// max.NaN.f32 / min.NaN.f32: a NaN operand gives NaN (the canonical one)
inline float max_nan(float a, float b) { return (a != a || b != b) ? NAN : (a > b ? a : b); }
inline float min_nan(float a, float b) { return (a != a || b != b) ? NAN : (a < b ? a : b); }
inline unsigned ld_acquire(const unsigned* p) {
    yield();  // (a spin loop: let the blocks it waits for run)
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

}  // namespace sfemu

#define threadIdx (sfemu::t_thread)
#define blockIdx (sfemu::t_block)
#define blockDim (sfemu::t_bdim)
#define gridDim (sfemu::t_gdim)
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __align__(n) __attribute__((aligned(n)))

inline void __syncthreads() { sfemu::t_blk->bar.wait(); }
inline int __syncthreads_or(int p) {
    int k = sfemu::t_cur->calls++ & 1;
    if (sfemu::t_thread.x == 0) __atomic_store_n(&sfemu::t_blk->acc[k ^ 1], 0, __ATOMIC_SEQ_CST);
    if (p) __atomic_fetch_or(&sfemu::t_blk->acc[k], 1, __ATOMIC_SEQ_CST);
    __syncthreads();
    int r = __atomic_load_n(&sfemu::t_blk->acc[k], __ATOMIC_SEQ_CST);
    __syncthreads();
    return r;
}
inline void __syncwarp(unsigned = 0xffffffffu) { sfemu::warp().bar.wait(); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <typename T> inline T __shfl_sync(unsigned, T v, int src) { return sfemu::exchange(v, src & 31, false); }
template <typename T> inline T __shfl_up_sync(unsigned, T v, unsigned d) {
    int l = sfemu::lane(); return sfemu::exchange(v, l - (int)d, l < (int)d); }
template <typename T> inline T __shfl_down_sync(unsigned, T v, unsigned d) {
    int l = sfemu::lane(); return sfemu::exchange(v, l + (int)d, l + (int)d > 31); }
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int m) { return sfemu::exchange(v, (sfemu::lane() ^ m) & 31, false); }
inline unsigned __ballot_sync(unsigned, int p) {
    sfemu::Warp& w = sfemu::warp();
    w.slot[sfemu::lane()] = p ? 1 : 0;
    w.bar.wait();
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= (unsigned)(w.slot[i] & 1) << i;
    w.bar.wait();
    return r;
}
template <typename T> inline unsigned __match_any_sync(unsigned mask, T v) {
    sfemu::Warp& w = sfemu::warp();
    unsigned long long bits = 0; memcpy(&bits, &v, sizeof(T));
    w.slot[sfemu::lane()] = bits;
    w.bar.wait();
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) if ((mask >> i & 1) && w.slot[i] == bits) r |= 1u << i;
    w.bar.wait();
    return r;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float f) { int x; memcpy(&x, &f, 4); return x; }
inline unsigned __float_as_uint(float f) { unsigned x; memcpy(&x, &f, 4); return x; }
inline float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
inline double __longlong_as_double(long long x) { double d; memcpy(&d, &x, 8); return d; }
inline long long __double_as_longlong(double d) { long long x; memcpy(&x, &d, 8); return x; }
template <typename A, typename B> inline typename std::common_type<A, B>::type min(A a, B b) { return a < b ? a : b; }
template <typename A, typename B> inline typename std::common_type<A, B>::type max(A a, B b) { return a < b ? b : a; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
template <typename T> inline T __ldcg(const T* p) { T v; __atomic_load(p, &v, __ATOMIC_RELAXED); return v; }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline T __ldg(const T* p) { return *p; }

template <typename T> inline T atomicAdd(T* p, T v) {
    if constexpr (std::is_floating_point<T>::value) {
        T old = *p, nv;
        do { nv = old + v; } while (!__atomic_compare_exchange(p, &old, &nv, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
        return old;
    } else {
        return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
    }
}
template <typename T> inline T atomicCAS(T* p, T cmp, T val) {
    __atomic_compare_exchange_n(p, &cmp, val, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}
template <typename T> inline T atomicMax(T* p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
template <typename T> inline T atomicMin(T* p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {}
    return old;
}
template <typename T> inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }

namespace sfemu {
typedef unsigned long long U;
#define SFEMU_U8 U, U, U, U, U, U, U, U
#define SFEMU_U32 SFEMU_U8, SFEMU_U8, SFEMU_U8, SFEMU_U8
typedef void (*Kernel)(SFEMU_U32, SFEMU_U32, SFEMU_U32, SFEMU_U32);  // 128 words
#define SFEMU_A8(o) a[o], a[o + 1], a[o + 2], a[o + 3], a[o + 4], a[o + 5], a[o + 6], a[o + 7]
#define SFEMU_A32(o) SFEMU_A8(o), SFEMU_A8(o + 8), SFEMU_A8(o + 16), SFEMU_A8(o + 24)
inline thread_local Kernel t_fn;
inline thread_local const unsigned long long* t_args;

inline void fiber_main() {
    const unsigned long long* a = t_args;
    // (every parameter is a pointer or an integer: extra words are harmless in the x86-64 ABI)
    t_fn(SFEMU_A32(0), SFEMU_A32(32), SFEMU_A32(64), SFEMU_A32(96));
    Fiber* f = t_cur;
    f->blk->warps[f->tid.x >> 5]->bar.leave();
    f->blk->bar.leave();
    f->blk->cl->bar.leave();
    ++t_progress;
    f->done = true;
    _longjmp(t_sched, 1);  // never resumed
}
}  // namespace sfemu

// Runs blocks [0, grid) of `block` threads, `wave` blocks at a time (a kernel whose blocks meet at
// grid barriers needs them all at once), kernel args as 64-bit words (pointers and integers only).
// `seed` != 0: the threads run in a new random order in every round (a missing barrier then shows
// as a read that runs before the write it needed, in some rounds). 0: done; -1: out of memory;
// -2: deadlock (every thread waits at a barrier no other reaches). `cluster`: blocks of a
// thread-block cluster (consecutive blocks; `wave` a multiple of it).
extern "C" int sfemu_launch(void* fn, unsigned grid, unsigned block, unsigned smem, const unsigned long long* args,
                            unsigned wave, unsigned seed, unsigned cluster) {
    using namespace sfemu;
    const size_t STACK = 96 * 1024;
    ucontext_t sched;
    t_fn = (Kernel)fn;
    t_args = args;
    t_bdim = {block, 1, 1};
    t_gdim = {grid, 1, 1};
    int rc = 0;
    for (unsigned b0 = 0; b0 < grid && rc == 0; b0 += wave) {
        unsigned nb = grid - b0 < wave ? grid - b0 : wave;
        std::vector<Block*> blocks;
        std::vector<Cluster*> clusters;
        std::vector<Fiber> fibers(nb * block);
        for (unsigned j = 0; j < nb; ++j) {
            Block* blk = new Block();
            blk->idx = {b0 + j, 0, 0};
            if (j % cluster == 0) {
                clusters.push_back(new Cluster());
                clusters.back()->bar.size = (int)(block * (nb - j < cluster ? nb - j : cluster));
            }
            blk->cl = clusters.back();
            blk->cl->blocks.push_back(blk);
            blk->dyn_size = smem;
            blk->dyn = (unsigned char*)aligned_alloc(256, (smem + 255) / 256 * 256 + 256);
            blk->bar.size = (int)block;
            for (unsigned w = 0; w < (block + 31) / 32; ++w) {
                Warp* wp = new Warp();
                wp->bar.size = (int)(block - w * 32 < 32 ? block - w * 32 : 32);
                blk->warps.push_back(wp);
            }
            blocks.push_back(blk);
        }
        for (unsigned k = 0; k < nb * block && rc == 0; ++k) {
            Fiber& f = fibers[k];
            f.blk = blocks[k / block];
            f.tid = {k % block, 0, 0};
            f.stack = malloc(STACK);
            if (!f.stack) { rc = -1; break; }
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack;
            f.ctx.uc_stack.ss_size = STACK;
            f.ctx.uc_link = &sched;
            makecontext(&f.ctx, (void (*)())fiber_main, 0);
        }
        size_t left = rc == 0 ? fibers.size() : 0;
        int idle = 0;
        std::vector<Fiber*> order;
        for (Fiber& f : fibers) order.push_back(&f);
        std::mt19937 rng(seed + b0);
        while (left > 0) {
            long before = t_progress;
            if (seed) std::shuffle(order.begin(), order.end(), rng);
            for (Fiber* fp : order) {
                Fiber& f = *fp;
                if (f.done) continue;
                t_cur = &f;
                t_thread = f.tid;
                t_blk = f.blk;
                t_block = f.blk->idx;
                if (!_setjmp(t_sched)) {
                    if (!f.started) { f.started = true; swapcontext(&sched, &f.ctx); }
                    else _longjmp(f.jb, 1);
                }
                if (f.done) --left;
            }
            idle = t_progress == before ? idle + 1 : 0;
            if (idle > 100000) { rc = -2; break; }  // (spinning on a grid barrier counts as idle)
        }
        for (Fiber& f : fibers) free(f.stack);
        for (Block* blk : blocks) {
            for (Warp* w : blk->warps) delete w;
            for (auto& kv : blk->statics) free(kv.second);
            free(blk->dyn);
            delete blk;
        }
        for (Cluster* c : clusters) delete c;
    }
    return rc;
}
