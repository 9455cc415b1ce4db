"""A stable LSD radix sort of one row of integer keys in one thread block of 1024 threads.

Keys are mapped to unsigned integers that order like the values (sign bit flipped; inverted for a
descending sort, so ties still keep input order), then sorted relative to the block's minimum:
only the bits of the key range take passes (MoE expert ids in [0, 256) take one 8-bit pass).

Layout: warp w owns the contiguous keys [w*S, w*S + S) and walks them 32 at a time (coalesced).
Within a warp, ballots on the digit bits group lanes with equal digits and `__popc(peers & lanes below)`
ranks them in lane order; a per-warp running count per digit (shared memory) carries the rank
across rounds. The exclusive scan of the counts in (digit, warp) order then gives every warp its
base per digit, so equal digits keep input order: the sort is stable with only four barriers a
pass. The first pass counts digits while loading the keys (the raw low byte, rotated by the
minimum once it is known) and reads the input again instead of a stored copy; a pass whose digit
is the same for every key is skipped; keys and 32-bit indices ping-pong through global scratch
(L2-resident), 32-bit keys when the range fits; the last pass writes the outputs directly.
"""

from __future__ import annotations

THREADS = 1024
WARPS = THREADS // 32
HIST_STRIDE = WARPS + 1  # counts at [digit * 33 + warp]: a warp's digits spread over the banks
SMEM_BYTES = 256 * HIST_STRIDE * 4
BATCH = 8  # rounds whose loads are issued together (latency hiding; 1024 threads leave 64 registers)


def scratch_bytes(L: int) -> int:
    return 2 * L * 8 + 2 * L * 4


def radix_body(*, L: int, k: int, key, base: int, smem_off: int, store_idx, store_val) -> str:
    """C code (a block) sorting L keys; needs blockDim.x == 1024.

    key(j): C expression of the unsigned 64-bit key of element j (an `int`).
    base: byte offset of scratch_bytes(L) bytes in sf_scratch.
    store_idx(pos, idx) / store_val(pos, u): statements writing output position `pos` (< k) from
    the element index / the unsigned key (store_val may be None)."""
    R = -(-L // (WARPS * 32))  # rounds per warp
    S = R * 32  # keys per warp
    B = min(BATCH, R)
    ka = f"((unsigned long long*)(sf_scratch + {base}))"
    kb = f"((unsigned long long*)(sf_scratch + {base + L * 8}))"
    ia = f"((int*)(sf_scratch + {base + 2 * L * 8}))"
    ib = f"((int*)(sf_scratch + {base + 2 * L * 8 + L * 4}))"
    vstore = store_val("pos", "(kk[q] + lo)") if store_val else ""
    vstore0 = store_val("j", "lo") if store_val else ""

    def rounds(body_load: str, body_use: str) -> str:
        """Walk this warp's rounds in batches of B: loads of a batch first, then their use."""
        return f"""      for (int r0 = 0; r0 < {R}; r0 += {B}) {{
        {body_load.strip()}
        #pragma unroll
        for (int q = 0; q < {B}; ++q) {{
          const int j = wbase + (r0 + q) * 32 + lane; const bool ok = r0 + q < {R} && j < {L};
          {body_use.strip()}
        }}
      }}"""

    load_rel = f"""unsigned long long kk[{B}];
        #pragma unroll
        for (int q = 0; q < {B}; ++q) {{ const int j = wbase + (r0 + q) * 32 + lane;
          kk[q] = (r0 + q < {R} && j < {L}) ? rel(j) : 0ULL; }}"""
    load_rel_ids = load_rel + f"""
        int id[{B}];
        #pragma unroll
        for (int q = 0; q < {B}; ++q) {{ const int j = wbase + (r0 + q) * 32 + lane;
          id[q] = raw ? j : ((r0 + q < {R} && j < {L}) ? (cur ? {ib} : {ia})[j] : 0); }}"""
    count_use = """const unsigned d = ok ? (unsigned)((kk[q] >> shift) & 255ULL) : 0u;
          const unsigned peers = match8(d, ok);
          if (ok && lane == 31 - __clz(peers)) hist[d * 33 + w] += __popc(peers);
          __syncwarp();"""
    scatter_use = f"""const unsigned d = ok ? (unsigned)((kk[q] >> shift) & 255ULL) : 0u;
          const unsigned peers = match8(d, ok);
          const int b = ok ? (int)hist[d * 33 + w] : 0;
          __syncwarp();
          if (ok && lane == 31 - __clz(peers)) hist[d * 33 + w] = (unsigned)b + __popc(peers);
          __syncwarp();
          if (ok) {{
            const int pos = b + __popc(peers & lt);
            if (last) {{ if (pos < {k}) {{ {store_idx("pos", "id[q]")} {vstore} }} }}
            else if (w32) {{ ((unsigned*)dk)[pos] = (unsigned)kk[q]; di[pos] = id[q]; }}
            else {{ dk[pos] = kk[q]; di[pos] = id[q]; }}
          }}"""
    first_load = f"""unsigned long long kk[{B}];
        #pragma unroll
        for (int q = 0; q < {B}; ++q) {{ const int j = wbase + (r0 + q) * 32 + lane;
          kk[q] = (r0 + q < {R} && j < {L}) ? {key("j")} : 0ULL; }}"""
    first_use = """if (ok) { lo = kk[q] < lo ? kk[q] : lo; hi = kk[q] > hi ? kk[q] : hi; }
          const unsigned d = ok ? (unsigned)(kk[q] & 255ULL) : 0u;
          const unsigned peers = match8(d, ok);
          if (ok && lane == 31 - __clz(peers)) hist[d * 33 + w] += __popc(peers);
          __syncwarp();"""
    return f"""  {{ // radix sort of {L} keys (one block of {THREADS} threads)
    unsigned* hist = (unsigned*)(sf_smem + {smem_off});
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, wbase = w * {S};
    const unsigned lt = (1u << lane) - 1u;
    // lanes of this warp whose (valid) digit equals d: one ballot per digit bit, as CUB's MatchAny
    // (on the H200 this took a 32768-key one-pass argsort from 80 us with __match_any_sync to 63 us)
    auto match8 = [](unsigned d, bool ok) -> unsigned {{
      unsigned m = __ballot_sync(0xffffffffu, ok);
      if (!ok) m = ~m;
      #pragma unroll
      for (int b = 0; b < 8; ++b) {{
        const unsigned v = __ballot_sync(0xffffffffu, (d >> b) & 1u);
        m &= ((d >> b) & 1u) ? v : ~v;
      }}
      return m;
    }};
    for (int e = threadIdx.x; e < {256 * HIST_STRIDE}; e += blockDim.x) hist[e] = 0u;
    __syncthreads();
    unsigned long long lo = ~0ULL, hi = 0ULL;
{rounds(first_load, first_use)}
    lo = sf_block_reduce(lo, [](unsigned long long a, unsigned long long b) {{ return a < b ? a : b; }});
    hi = sf_block_reduce(hi, [](unsigned long long a, unsigned long long b) {{ return a > b ? a : b; }});
    const unsigned long long range = hi - lo;
    const int nbits = range ? 64 - __clzll((long long)range) : 0;
    const bool w32 = nbits <= 32;
    bool raw = true;  // keys not stored yet: read the input again; indices are positions
    int cur = 0;
    auto rel = [&](int j) -> unsigned long long {{
      if (raw) return ({key("j")}) - lo;
      return w32 ? (unsigned long long)((unsigned*)(cur ? {kb} : {ka}))[j] : (cur ? {kb} : {ka})[j];
    }};
    if (nbits == 0) {{  // all keys equal: input order
      for (int j = threadIdx.x; j < {k}; j += blockDim.x) {{ {store_idx("j", "j")} {vstore0} }}
    }}
    for (int shift = 0; shift < nbits; shift += 8) {{
      const bool last = shift + 8 >= nbits;  // the top digit separates lo from hi: never skipped
      if (shift > 0) {{
        for (int e = threadIdx.x; e < {256 * HIST_STRIDE}; e += blockDim.x) hist[e] = 0u;
        __syncthreads();
{rounds(load_rel, count_use)}
        __syncthreads();
      }}
      {{  // exclusive scan of the counts in (digit, warp) order; thread t: digit t/4, warps 8(t%4)..+8
        const int d = threadIdx.x >> 2, w0 = (threadIdx.x & 3) * 8;
        const int hd = shift == 0 ? (int)((d + (unsigned)lo) & 255u) : d;  // first pass counted raw bytes
        unsigned v[8], s = 0;
        #pragma unroll
        for (int q = 0; q < 8; ++q) {{ v[q] = hist[hd * 33 + w0 + q]; s += v[q]; }}
        unsigned dt = s + __shfl_xor_sync(0xffffffffu, s, 1);
        dt += __shfl_xor_sync(0xffffffffu, dt, 2);
        unsigned tot;
        unsigned run = sf_block_scan(s, [](unsigned a, unsigned b) {{ return a + b; }}, tot) - s;
        #pragma unroll
        for (int q = 0; q < 8; ++q) {{ hist[d * 33 + w0 + q] = run; run += v[q]; }}
        if (__syncthreads_or(dt == {L}u)) continue;  // every key has this digit: nothing moves
      }}
      unsigned long long* dk = (raw || cur) ? {ka} : {kb};
      int* di = (raw || cur) ? {ia} : {ib};
{rounds(load_rel_ids, scatter_use)}
      __syncthreads();
      cur = (raw || cur) ? 0 : 1;
      raw = false;
    }}
  }}"""
