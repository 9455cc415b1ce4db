"""Our own GPU argsort for long 1-D rows: a stable LSD radix sort (8-bit digits) in ONE launch.

Why one persistent kernel: the rows that reach a library sort are a few MiB, so a sort is bound
by launches and host overhead, not bandwidth. A grid of blocks that all fit on the GPU at once
(<= SMs x occupancy) walks every pass, meeting at software grid barriers, so the host launches
one kernel whatever the key width, and no pass decision ever needs a host sync.

Per call: phase 0 reads the row once, transforming each element to an order-preserving unsigned
key (descending = bitwise NOT, so one ascending stable sort serves both orders), and computes the
key range (min, max) and each block's digit-0 histogram. Only digit positions up to the highest
byte in which min and max differ can change the order (the bytes above it are equal for every
key), so MoE expert ids in [0, 256) sort in one pass whatever their dtype. A pass whose global
histogram has one bucket holding every key is skipped too (all blocks decide alike, on device).
Each executed pass: per-block digit counts -> barrier -> each block's offsets (global digit base
+ the counts of the blocks before it) -> per 4096-key tile a stable rank (warp match_any and
per-warp digit counters), a local sort in shared memory, and a coalesced-by-run scatter. The
pass at the top digit (never skipped: min and max differ there) writes the int64 indices.
Latency, not bandwidth, decides at MoE sizes (32768 keys: 8 blocks of one tile), so phase 0 has
all of a thread's loads in flight at once and leaves a one-tile chunk's keys in shared memory for
the first pass (no second read of the row), and digit 0's global counts and block prefix are
loaded together with the key range right after the first barrier (per-block counts are double
buffered by pass parity, so a block still reading digit 0's may not be overtaken).

Fused variant (`Epilogue`, rendered by sort_epilogue.py): the same kernel with
the graph's consumers of the index row in its final pass: stores at the sorted position
(`o[pos] = f(idx)`) run in sorted order, stores at the index (`o[idx] = g(pos)`, a permutation
scatter) in element order, so both coalesce in a one-pass sort. H200, MoE argsort fusion
(kernel time): T=4096 int64 15.2 us in one launch (the plain sort alone 14.5 us; the old plan,
key copy + sort + consumers, 21.8 us in 4 launches), T=65536 19.6 us (old plan 37.5 us).

Indices are int32 inside (rows < 2^31), int64 outside. Floats: -0.0 becomes +0.0 and every NaN
one positive quiet NaN before the bit transform, so ties stay stable and NaN sorts after +inf
(first when descending), as torch.sort does.

This module is the kernel's text (and the sizes the host derives from it); compiler/cuda/radix_sort.py
launches it. (The source's first comment still names compiler/cuda/radix_sort.py: it is part of the
kernel text, so changing it would change every radix-sort cubin's cache key.)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

THREADS = 512
ITEMS = 8
TILE = THREADS * ITEMS
WARPS = THREADS // 32
MAX_BLOCKS_PER_SM = 2  # __launch_bounds__(THREADS, 2): two blocks always fit (registers, smem)

# numpy dtype name -> (C type read from memory, key width in bits, transform kind)
_DTYPES = {
    "bool": ("unsigned char", 8, "bool"),
    "uint8": ("unsigned char", 8, "uint"),
    "int8": ("unsigned char", 8, "int"),
    "uint16": ("unsigned short", 16, "uint"),
    "int16": ("unsigned short", 16, "int"),
    "float16": ("unsigned short", 16, "float"),
    "uint32": ("unsigned int", 32, "uint"),
    "int32": ("unsigned int", 32, "int"),
    "float32": ("unsigned int", 32, "float"),
    "uint64": ("unsigned long long", 64, "uint"),
    "int64": ("unsigned long long", 64, "int"),
    "float64": ("unsigned long long", 64, "float"),
}

# float layout per width: (exponent-all-ones mask, canonical quiet NaN)
_FLOAT_BITS = {16: ("0x7c00u", "0x7e00u"), 32: ("0x7f800000u", "0x7fc00000u"),
               64: ("0x7ff0000000000000ull", "0x7ff8000000000000ull")}

SUPPORTED = tuple(_DTYPES)


def _transform(raw: str, bits: int, kind: str) -> str:
    """C body of `to_key(RAW b) -> KEY` (ascending order-preserving unsigned key)."""
    sign = "0x8000000000000000ull" if bits == 64 else f"0x{1 << (bits - 1):x}u"
    if kind == "bool":
        return "return b ? 1u : 0u;"
    if kind == "uint":
        return "return (KEY)b;"
    if kind == "int":
        return f"return (KEY)(b ^ ({raw}){sign});"
    inf, nan = _FLOAT_BITS[bits]
    absmask = "0x7fffffffffffffffull" if bits == 64 else f"0x{(1 << (bits - 1)) - 1:x}u"
    full = "0xffffffffffffffffull" if bits == 64 else f"0x{(1 << bits) - 1:x}u"
    return (f"{raw} a = ({raw})(b & ({raw}){absmask});\n"
            f"    if (a > ({raw}){inf}) b = ({raw}){nan};   // every NaN: one positive quiet NaN\n"
            f"    else if (a == 0) b = 0;                    // -0.0 == +0.0\n"
            f"    return (b & ({raw}){sign}) ? (KEY)((b ^ ({raw}){full}) & ({raw}){full}) : (KEY)(b | ({raw}){sign});")


_TEMPLATE = r"""
// stable LSD radix argsort, one persistent launch (generated by segfuse compiler/cuda/radix_sort.py)
$HELPERS
typedef $RAW RAW;
typedef $KEY KEY;
#define KBITS $BITS
#define NT $THREADS
#define NW $WARPS
#define ITEMS $ITEMS
#define TILE $TILE

__device__ __forceinline__ KEY to_key(RAW b) {
    $TRANSFORM
}

__device__ __forceinline__ KEY key_mask(KEY k) {
#if KBITS < 32
    return k & (KEY)((1u << KBITS) - 1u);
#else
    return k;
#endif
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// All blocks are resident (a cooperative launch of at most the occupancy), so they can meet here.
// Same scheme as cooperative groups' grid sync: block barrier, one fenced arrival, spin, block barrier.
__device__ __forceinline__ void grid_sync(unsigned* bar, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(bar, 1u);
        while (ld_acquire(bar) < target) { }
        __threadfence();
    }
    __syncthreads();
}

// exclusive scan of one value per thread t < 256 (threads >= 256 pass 0); all threads call it
__device__ __forceinline__ unsigned scan256(unsigned v, unsigned* tmp) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    unsigned x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        unsigned y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (w < 8 && lane == 31) tmp[w] = x;
    __syncthreads();
    unsigned add = 0;
    if (w < 8)
        for (int q = 0; q < w; ++q) add += tmp[q];
    __syncthreads();
    return x - v + add;
}

__device__ __forceinline__ void sort_body(
    const RAW* __restrict__ x, int n, int desc, long long* __restrict__ out,
    KEY* ka, KEY* kb, int* va, int* vb,
    unsigned* counts,                 // [2][grid][256] per-block digit counts, pass d in half d & 1
    unsigned* ghist,                  // [KBITS/8][256] global digit histograms (zero on entry)
    unsigned long long* mm,           // [2]: max key, max ~key (zero on entry)
    unsigned* bar$EPI_PARAMS)                    // grid barrier arrivals (zero on entry)
{
    extern __shared__ __align__(16) unsigned char smem[];
    KEY* sk = (KEY*)smem;                        // TILE keys, locally sorted
    int* sv = (int*)(sk + TILE);                 // TILE indices
    unsigned* whist = (unsigned*)(sv + TILE);    // [NW][256] per-warp digit counters
    unsigned* lstart = whist + NW * 256;         // tile-local digit starts
    unsigned* tcount = lstart + 256;             // tile digit counts
    unsigned* boff = tcount + 256;               // this block's next global position per digit
    unsigned* pre = boff + 256;                  // [NT] partial block prefixes
    unsigned* tmp = pre + NT;                    // [32] scan scratch
    KEY* redmax = (KEY*)(tmp + 32);              // [NW] per-warp key maxima (8-byte aligned)
    KEY* rednot = redmax + NW;                   // [NW] per-warp maxima of ~key
    int& skip = *(int*)(rednot + NW);            // this pass changes nothing

    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int G = gridDim.x, b = blockIdx.x;
    const long long chunk = ((long long)n + G - 1) / G;
    const int lo = (int)min((long long)n, chunk * b);
    const int hi = (int)min((long long)n, chunk * b + chunk);
    const KEY flip = desc ? key_mask((KEY)~(KEY)0) : (KEY)0;
    unsigned nbar = 0;

    // ---- phase 0: key range and digit-0 counts, straight from the input ----
    for (int i = tid; i < NW * 256; i += NT) whist[i] = 0;
    __syncthreads();
    KEY kmax = 0, knot = 0;
    // A one-tile chunk's keys stay in shared memory (sk is free until a pass sorts into it), in
    // the pass's layout: the first pass reads them there instead of reading x again.
    const bool one_tile = hi - lo <= TILE;
    for (int t0 = lo; t0 < hi; t0 += TILE) {
        const int tn = min(TILE, hi - t0);
        KEY k0[ITEMS];
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) {  // all of a thread's loads in flight at once
            const int li = w * 32 * ITEMS + j * 32 + lane;
            k0[j] = li < tn ? (KEY)(to_key(x[t0 + li]) ^ flip) : (KEY)0;
        }
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) {
            const int li = w * 32 * ITEMS + j * 32 + lane;
            if (li < tn) {
                const KEY k = k0[j];
                if (one_tile) sk[li] = k;
                kmax = k > kmax ? k : kmax;
                const KEY nk = key_mask((KEY)~k);
                knot = nk > knot ? nk : knot;
                atomicAdd(&whist[w * 256 + (unsigned)(k & 255)], 1u);
            }
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        KEY a = __shfl_xor_sync(0xffffffffu, kmax, o), c = __shfl_xor_sync(0xffffffffu, knot, o);
        kmax = a > kmax ? a : kmax;
        knot = c > knot ? c : knot;
    }
    if (lane == 0) { redmax[w] = kmax; rednot[w] = knot; }
    __syncthreads();
    if (tid == 0) {
        for (int q = 1; q < NW; ++q) {
            kmax = redmax[q] > kmax ? redmax[q] : kmax;
            knot = rednot[q] > knot ? rednot[q] : knot;
        }
        if (hi > lo) {
            atomicMax(&mm[0], (unsigned long long)kmax);
            atomicMax(&mm[1], (unsigned long long)knot);
        }
    }
    if (tid < 256) {
        unsigned c = 0;
        for (int q = 0; q < NW; ++q) c += whist[q * 256 + tid];
        counts[b * 256 + tid] = c;
        if (c) atomicAdd(&ghist[tid], c);
    }
$EPI_INIT
    grid_sync(bar, ++nbar * G);

    const KEY gmax = (KEY)__ldcg(&mm[0]);
    const KEY gmin = key_mask((KEY)~(KEY)__ldcg(&mm[1]));
    // digit 0's global counts and the counts of the blocks before this one, loaded together with
    // the key range (one round trip instead of three; phase 0 made them)
    const unsigned g_d0 = tid < 256 ? __ldcg(&ghist[tid]) : 0u;$EPI_HIST
    unsigned pre_d0 = 0;
    {
        const int dg = tid & 255, half = tid >> 8, mid = b >> 1;
        const int q0 = half ? mid : 0, q1 = half ? b : mid;
#pragma unroll 8
        for (int q = q0; q < q1; ++q) pre_d0 += __ldcg(&counts[q * 256 + dg]);
    }
    if (gmax == gmin) {  // all keys equal: the identity permutation
        for (int i = lo + tid; i < hi; i += NT) { const long long pos = i, idx = i; $EPI_STORE $EPI_SCATTER }
        return;
    }
    const int top = (63 - __clzll((long long)((unsigned long long)(gmax ^ gmin)))) >> 3;

    int src = -1;  // -1: the input (index = position); 0: ka/va; 1: kb/vb
    for (int d = 0; d <= top; ++d) {
        const int shift = 8 * d;
        if (d > 0) {  // per-block counts of this digit over the current arrangement
            for (int i = tid; i < NW * 256; i += NT) whist[i] = 0;
            __syncthreads();
            const KEY* ks = src == 0 ? ka : kb;
            // (the other half: a block still prefetching digit 0's prefix may read half 0 now)
            unsigned* cnt = counts + (d & 1) * G * 256;
            for (int i = lo + tid; i < hi; i += NT) {
                KEY k = src < 0 ? (to_key(x[i]) ^ flip) : __ldcg(&ks[i]);
                atomicAdd(&whist[w * 256 + (unsigned)((k >> shift) & 255)], 1u);
            }
            __syncthreads();
            if (tid < 256) {
                unsigned c = 0;
                for (int q = 0; q < NW; ++q) c += whist[q * 256 + tid];
                cnt[b * 256 + tid] = c;
                if (c) atomicAdd(&ghist[d * 256 + tid], c);
            }
            grid_sync(bar, ++nbar * G);
        }
        // one bucket holding every key leaves the order unchanged: skip (uniform over the grid,
        // every block reads the same histogram)
        if (tid == 0) skip = 0;
        __syncthreads();
        const unsigned g = d == 0 ? g_d0 : tid < 256 ? __ldcg(&ghist[d * 256 + tid]) : 0u;
        if (tid < 256 && g == (unsigned)n) skip = 1;
        const unsigned base = scan256(g, tmp);  // global digit base (its barriers publish `skip`)
        if (skip) continue;
        {   // + the counts of the blocks before this one (two halves of the threads share the sum)
            const int dg = tid & 255, half = tid >> 8, mid = b >> 1;
            const int q0 = half ? mid : 0, q1 = half ? b : mid;
            unsigned s = pre_d0;
            if (d > 0) {
                s = 0;
                const unsigned* cnt = counts + (d & 1) * G * 256;
#pragma unroll 8
                for (int q = q0; q < q1; ++q) s += __ldcg(&cnt[q * 256 + dg]);
            }
            pre[tid] = s;
        }
        __syncthreads();
        if (tid < 256) boff[tid] = base + pre[tid] + pre[256 + tid];
        for (int i = tid; i < NW * 256; i += NT) whist[i] = 0;
        __syncthreads();

        const bool last = d == top;
        const KEY* ks = src == 0 ? ka : kb;
        const int* vs = src == 0 ? va : vb;
        KEY* kd = src == 0 ? kb : ka;
        int* vd = src == 0 ? vb : va;
        for (int t0 = lo; t0 < hi; t0 += TILE) {
            const int tn = min(TILE, hi - t0);
            KEY k[ITEMS];
            int v[ITEMS];
            unsigned r[ITEMS];
#pragma unroll
            for (int j = 0; j < ITEMS; ++j) {
                const int li = w * 32 * ITEMS + j * 32 + lane;
                k[j] = 0; v[j] = 0;
                if (li < tn) {
                    const int i = t0 + li;
                    if (src < 0) { k[j] = one_tile ? sk[li] : (KEY)(to_key(x[i]) ^ flip); v[j] = i; }
                    else { k[j] = __ldcg(&ks[i]); v[j] = __ldcg(&vs[i]); }
                }
            }
            // stable rank inside the warp: keys ordered by (j, lane) = by position
            const unsigned lt = (1u << lane) - 1u;
#pragma unroll
            for (int j = 0; j < ITEMS; ++j) {
                const int li = w * 32 * ITEMS + j * 32 + lane;
                const bool ok = li < tn;
                const unsigned dg = ok ? (unsigned)((k[j] >> shift) & 255) : 256u;
                const unsigned peers = __match_any_sync(0xffffffffu, dg);
                unsigned before = 0;
                if (ok) before = whist[w * 256 + dg];
                r[j] = before + __popc(peers & lt);
                __syncwarp();
                if (ok && lane == 31 - __clz(peers)) whist[w * 256 + dg] = before + __popc(peers);
                __syncwarp();
            }
            __syncthreads();
            unsigned tc = 0;
            if (tid < 256) {  // per-warp counts -> exclusive offsets across warps
                for (int q = 0; q < NW; ++q) {
                    unsigned c = whist[q * 256 + tid];
                    whist[q * 256 + tid] = tc;
                    tc += c;
                }
                tcount[tid] = tc;
            }
            unsigned ls = scan256(tc, tmp);
            if (tid < 256) lstart[tid] = ls;
            __syncthreads();
#pragma unroll
            for (int j = 0; j < ITEMS; ++j) {
                const int li = w * 32 * ITEMS + j * 32 + lane;
                if (li < tn) {
                    const unsigned dg = (unsigned)((k[j] >> shift) & 255);
                    const unsigned p = lstart[dg] + whist[w * 256 + dg] + r[j];
                    sk[p] = k[j];
                    sv[p] = v[j];
                    if (last) {  // stores at the element's index: in index order, coalesced when v = i
                        const long long pos = boff[dg] + (p - lstart[dg]), idx = v[j];
                        $EPI_SCATTER
                    }
                }
            }
            __syncthreads();
            for (int li = tid; li < tn; li += NT) {
                const KEY kk = sk[li];
                const unsigned dg = (unsigned)((kk >> shift) & 255);
                const unsigned gp = boff[dg] + (unsigned)li - lstart[dg];
                if (last) { const long long pos = gp, idx = sv[li]; $EPI_STORE }
                else { kd[gp] = kk; vd[gp] = sv[li]; }
            }
            __syncthreads();
            if (tid < 256) boff[tid] += tcount[tid];
            for (int i = tid; i < NW * 256; i += NT) whist[i] = 0;
            __syncthreads();
        }
        if (last) return;
        src = src == 0 ? 1 : 0;
        grid_sync(bar, ++nbar * G);  // the next pass reads what every block wrote
    }
}

// ctr: ghist [8][256] u32 | mm [2] u64 | barrier arrivals | blocks done. Zero on entry; the last
// block to finish zeroes it again, so the host keeps one buffer per stream and never clears it.
// scratch (no initial contents): keys A | keys B | indices A | indices B | [2][grid][256] counts.
extern "C" __global__ void __launch_bounds__(NT, 2) $NAME(
    const RAW* __restrict__ x, int n, int desc, long long* __restrict__ out,
    unsigned char* scratch, unsigned* ctr$EPI_PARAMS)
{
    __shared__ unsigned s_last;
    const size_t nk = ((size_t)n * sizeof(KEY) + 255) / 256 * 256;
    const size_t nv = ((size_t)n * 4 + 255) / 256 * 256;
    unsigned long long* mm = (unsigned long long*)(ctr + 8 * 256);
    unsigned* bar = ctr + 8 * 256 + 4;
    sort_body(x, n, desc, out, (KEY*)scratch, (KEY*)(scratch + nk), (int*)(scratch + 2 * nk),
              (int*)(scratch + 2 * nk + nv), (unsigned*)(scratch + 2 * nk + 2 * nv), ctr, mm, bar$EPI_ARGS);
    // Every block returns from sort_body only after its last read of ctr (all its threads have
    // passed this barrier), so once all gridDim.x blocks have counted themselves out, the last
    // one may clear the counters for the next launch on this stream.
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        s_last = atomicAdd(&bar[1], 1u) == gridDim.x - 1 ? 1u : 0u;
    }
    __syncthreads();
    if (s_last) {
        __threadfence();
        for (int i = threadIdx.x; i < (KBITS / 8) * 256; i += NT) ctr[i] = 0u;  // ghist
        if (threadIdx.x == 0) { mm[0] = 0ull; mm[1] = 0ull; bar[0] = 0u; bar[1] = 0u; }
    }
}
"""


def smem_bytes(key_bytes: int) -> int:
    return TILE * (key_bytes + 4) + (WARPS * 256 + 3 * 256 + THREADS + 32) * 4 + 2 * WARPS * key_bytes + 16


CTR_BYTES = 8 * 256 * 4 + 16 + 8  # ghist [8][256] u32 | mm [2] u64 | barrier, blocks done (u32)


def scratch_bytes(n: int, key_bytes: int, grid: int) -> int:
    """Bytes of the per-call scratch, laid out as the kernel derives it from n."""
    nk = -(-n * key_bytes // 256) * 256
    nv = -(-n * 4 // 256) * 256
    return 2 * nk + 2 * nv + 2 * grid * 256 * 4


@dataclass(frozen=True)
class Epilogue:
    """What a fused variant of the kernel does besides sorting (compiler/codegen/sort_epilogue.py
    renders it). The kernel gains the parameters `long long* sf_err` (the runtime's error word)
    and `e0..ek-1`, one pointer per entry of `params` (its C element type), written only by this
    C text:
    - `init`: statements run once per thread in phase 0, before the first grid barrier (which
      orders them before every final store); `sf_gtid` / `sf_gstride` index the whole grid;
    - `store`: statements run once per sorted position, in the final pass (or the all-equal
      shortcut), with `pos` (the position in sorted order) and `idx` (the index of the key
      sorted there, i.e. argsort's value at pos) in scope, both `long long`; run in sorted
      order, so stores at `pos` coalesce;
    - `scatter`: the same, run in the threads' element order (before the tile's local sort), so
      stores at `idx` coalesce when the final pass reads the input (a one-pass sort, as MoE ids
      are: an SM then writes whole lines instead of one sector per element);
    - `hist`: statements run by every block right after the first grid barrier, before the
      all-equal shortcut, with the global key range (`gmin`, `gmax`), `flip`, `ghist` (phase 0's
      complete global digit-0 counts), `tmp` and `scan256` in scope (a block-uniform condition
      may pick one block: `scan256` needs all of its threads);
    - `helpers`: definitions placed before the kernel (the codegen prelude for `sf_*` calls).
    Then the kernel stores no int64 index (`out` may be null): the epilogue writes what the
    graph needs. The text comes from the codegen's renderers, never from user strings."""

    params: tuple = ()
    init: str = ""
    store: str = ""
    scatter: str = ""
    hist: str = ""
    helpers: str = ""


_PLAIN_STORE = "out[pos] = idx;"


def source(dtype, epilogue: Epilogue | None = None) -> tuple[str, str]:
    """(CUDA source, kernel name) of the argsort kernel for a NumPy dtype, plain or with an
    epilogue. The source holds only text from fixed tables and the epilogue's rendered C (no user
    strings); the name is a hash of it, as the codegen names."""
    dt = np.dtype(dtype)
    raw, bits, kind = _DTYPES[dt.name]
    key = "unsigned long long" if bits == 64 else "unsigned int"
    if epilogue is None:
        helpers, plist, alist, init, store, scatter, hist = "", "", "", "", _PLAIN_STORE, "", ""
    else:
        plist = ", long long* __restrict__ sf_err" + "".join(
            f", {c}* __restrict__ e{i}" for i, c in enumerate(epilogue.params))
        alist = ", sf_err" + "".join(f", e{i}" for i in range(len(epilogue.params)))
        init = ""
        if epilogue.init:
            init = ("    {\n        const long long sf_gtid = (long long)b * NT + tid, sf_gstride = (long long)G * NT;\n"
                    f"        {epilogue.init}\n    }}")
        helpers, store, scatter = epilogue.helpers, epilogue.store, epilogue.scatter
        hist = f"\n    {epilogue.hist}" if epilogue.hist else ""  # (none: the text of the kernels before)
    src = _TEMPLATE
    for k, v in (("$HELPERS", helpers), ("$EPI_PARAMS", plist), ("$EPI_ARGS", alist), ("$EPI_INIT", init), ("$EPI_HIST", hist),
                 ("$EPI_STORE", store), ("$EPI_SCATTER", scatter), ("$TRANSFORM", _transform("RAW", bits, kind)), ("$RAW", raw),
                 ("$KEY", key), ("$BITS", str(bits)), ("$THREADS", str(THREADS)), ("$WARPS", str(WARPS)),
                 ("$ITEMS", str(ITEMS)), ("$TILE", str(TILE))):
        src = src.replace(k, v)
    name = "sf_k_" + hashlib.sha256(src.encode()).hexdigest()[:16] + "_0"
    return src.replace("$NAME", name), name


_NP_DTYPES = frozenset(np.dtype(d) for d in _DTYPES)


def takes(shape, dtype, axis) -> bool:
    """Rows this sort takes: every element along `axis` (other dims of size 1), a dtype above,
    and fewer than 2^31 - TILE elements (int32 indices)."""
    try:
        if np.dtype(dtype) not in _NP_DTYPES:
            return False
    except TypeError:
        return False
    size = 1
    for d in shape:
        size *= int(d)
    return len(shape) >= 1 and int(shape[axis]) == size and 0 < size < 2**31 - TILE


def key_bytes(dtype) -> int:
    """Bytes of the kernel's unsigned sort key for a NumPy dtype (4 or 8)."""
    return 8 if _DTYPES[np.dtype(dtype).name][1] == 64 else 4


def supported(x, axis) -> bool:
    """`takes` for an array (CuPy or NumPy)."""
    return takes(x.shape, x.dtype, axis)
