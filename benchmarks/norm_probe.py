"""Hand-written RMSNorm and LayerNorm kernels in the formulations torch.compile and segfuse use,
timed beside segfuse's generated kernel, torch.compile's Triton kernel and a copy of the same bytes
in one process (issue 20: the float32 rows at 32768 rows where torch.compile runs faster than
torch's own copy kernel). They are written by hand because they are the question, not the answer:
which formulation reaches the DRAM bandwidth Triton reaches. Variants (a block per row, 16-byte
vector accesses):

- `regs`:   the row in registers, the weights too (what segfuse generates today);
- `regs_w`: the row in registers, the weights read per element in the last pass (L1/L2 hits);
- `reload`: Triton's looped ("red") form: each pass re-reads the row from global memory, hitting
  L1 after the first (few registers, full occupancy), the weights read in the last pass;
- `copy`:   the row read and written as it is (the bytes' own limit in this form);
- `reload_hints`: `reload` with the cache hints of torch.compile's kernels (its PTX on the H200,
  2026-12-02): the first pass's loads L1 and L2 evict-last, the re-reads evict-first, the weights
  evict-last;
- `regs_hints`: `regs_w` with the row's one load and the weights' evict-last;
and threads per block in {256, 512, 1024} (`/T` in the names).

`python benchmarks/norm_probe.py rmsnorm:float32:32768x4096 layernorm:float32:32768x4096 ...`
prints a line per kernel: GPU us (kernels back to back, CUDA events, median of 5 runs of 20),
the ratio to torch.compile's, and max |error| against torch."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

SOURCE = r"""
#define EPS 1e-6f
typedef unsigned short bf16;  // (no cuda_bf16.h: the raw bits, rounded to nearest even)
// 16 bytes of the element type E: VEC elements
template <typename E> struct Vec;
template <> struct Vec<float> { static const int N = 4; float4 v;
  __device__ float get(int i) const { return (&v.x)[i]; } __device__ void set(int i, float f) { (&v.x)[i] = f; } };
template <> struct Vec<bf16> { static const int N = 8; uint4 v;
  __device__ float get(int i) const { return __uint_as_float((unsigned)((const bf16*)&v)[i] << 16); }
  __device__ void set(int i, float f) { unsigned u = __float_as_uint(f); ((bf16*)&v)[i] = (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); } };

// loads the compiler cannot merge with an earlier one of the same address (the `reload` forms'
// later passes: without it, nvcc keeps the first pass's values in registers, as `regs` does), with
// torch.compile's cache hints where H says so: 0 none, 1 L1 and L2 evict-last, 2 L1 and L2 evict-first
template <int H, typename V> __device__ __forceinline__ V ld(const V* p) {
  V r; unsigned* u = (unsigned*)&r.v;
  if (H == 0) {
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3]) : "l"(p));
  } else if (H == 1) {
    unsigned long long pol; asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3]) : "l"(p), "l"(pol));
  } else {
    unsigned long long pol; asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile("ld.global.L1::evict_first.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                 : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3]) : "l"(p), "l"(pol));
  }
  return r;
}

template <int T> __device__ __forceinline__ float block_sum(float a, float* sm) {
  for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
  if (T == 32) return a;
  if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = a;
  __syncthreads();
  float s = 0;
  #pragma unroll
  for (int i = 0; i < T / 32; ++i) s += sm[i];
  return s;
}

// MODE 0 regs, 1 regs_w, 2 reload, 3 copy, 4 reload_hints, 5 regs_hints; LN: LayerNorm (else RMSNorm)
template <typename E, int T, int D, int MODE, bool LN>
__device__ __forceinline__ void norm(const E* __restrict__ x, const E* __restrict__ w, const E* __restrict__ b, E* __restrict__ y) {
  typedef Vec<E> V;
  constexpr int NV = D / (V::N * T);  // vectors a thread
  __shared__ float sm0[32], sm1[32];
  const V* xr = (const V*)(x + (size_t)blockIdx.x * D);
  V* yr = (V*)(y + (size_t)blockIdx.x * D);
  const V* wv = (const V*)w; const V* bv = (const V*)b;
  const int t = threadIdx.x;
  constexpr bool RELOAD = MODE == 2 || MODE == 4, HINTS = MODE >= 4;
  constexpr int FIRST = HINTS ? 1 : 0, AGAIN = MODE == 4 ? 2 : 0, WH = HINTS ? 1 : 0;  // the hints of each load
  if (MODE == 3) {
    #pragma unroll
    for (int i = 0; i < NV; ++i) yr[t + i * T] = xr[t + i * T];
    return;
  }
  V xs[RELOAD ? 1 : NV], ws[MODE == 0 ? NV : 1], bs[MODE == 0 && LN ? NV : 1];
  if (MODE == 0) {
    #pragma unroll
    for (int i = 0; i < NV; ++i) { ws[i] = wv[t + i * T]; if (LN) bs[i] = bv[t + i * T]; }
  }
  float a = 0;
  #pragma unroll
  for (int i = 0; i < NV; ++i) {
    V v = HINTS ? ld<FIRST>(xr + t + i * T) : xr[t + i * T];
    if (!RELOAD) xs[i] = v;
    #pragma unroll
    for (int e = 0; e < V::N; ++e) { float f = v.get(e); a += LN ? f : f * f; }
  }
  a = block_sum<T>(a, sm0);
  float mean = a / D, scale;
  if (LN) {
    float q = 0;
    #pragma unroll
    for (int i = 0; i < NV; ++i) {
      V v = RELOAD ? ld<AGAIN>(xr + t + i * T) : xs[i];
      #pragma unroll
      for (int e = 0; e < V::N; ++e) { float d = v.get(e) - mean; q += d * d; }
    }
    q = block_sum<T>(q, sm1);
    scale = rsqrtf(q / D + EPS);
  } else {
    scale = rsqrtf(mean + EPS);
  }
  #pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int k = t + i * T;
    V v = RELOAD ? ld<AGAIN>(xr + k) : xs[i];
    V ww = MODE == 0 ? ws[i] : HINTS ? ld<WH>(wv + k) : wv[k];
    V bb; if (LN) bb = MODE == 0 ? bs[i] : HINTS ? ld<WH>(bv + k) : bv[k];
    V o;
    #pragma unroll
    for (int e = 0; e < V::N; ++e) {
      float f = LN ? (v.get(e) - mean) * scale * ww.get(e) + bb.get(e) : v.get(e) * scale * ww.get(e);
      o.set(e, f);
    }
    yr[k] = o;
  }
}
"""

THREADS = tuple(int(t) for t in os.environ.get("PROBE_THREADS", "256,512,1024").split(","))
MODES = {"regs": 0, "regs_w": 1, "reload": 2, "copy": 3, "reload_hints": 4, "regs_hints": 5}


def kernel_source(name, dtype, T, D, mode, ln):
    e = "float" if dtype == "float32" else "bf16"
    return (f'extern "C" __global__ void __launch_bounds__({T}) {name}(const {e}* x, const {e}* w, const {e}* b, {e}* y)'
            f' {{ norm<{e}, {T}, {D}, {MODES[mode]}, {str(ln).lower()}>(x, w, b, y); }}\n')


def main(argv):
    import cupy as cp
    import numpy as np
    import torch
    from norm_graphs import norm_graph, norm_inputs, torch_norm
    from segfuse.compiler.cuda.runtime import get_runtime
    from segfuse.compiler.engine import Engine

    def events_us(launch, reps=20, runs=5):
        launch()
        cp.cuda.runtime.deviceSynchronize()
        out = []
        for _ in range(runs):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            for _ in range(reps):
                launch()
            b.record()
            b.synchronize()
            out.append(cp.cuda.get_elapsed_time(a, b) * 1000.0 / reps)
        return float(np.median(out))

    eng, rt = Engine("cupy"), get_runtime()
    for spec in argv:
        kind, dtype, shape = spec.split(":")
        R, D = (int(v) for v in shape.split("x"))
        host = norm_inputs(kind, R, D, dtype, seed=1)
        tdt = torch.float32 if dtype == "float32" else torch.bfloat16
        t_ins = {k: torch.from_numpy(np.asarray(v).astype(np.float32)).to(tdt).cuda() for k, v in host.items()}
        if "b" not in t_ins:
            t_ins["b"] = torch.zeros_like(t_ins["w"])
        want = torch_norm(kind, t_ins).float()
        torch._dynamo.reset()
        compiled = torch.compile(lambda ti, kind=kind: torch_norm(kind, ti), dynamic=False)
        compiled(t_ins)
        torch.cuda.synchronize()
        results = {"torch.compile": events_us(lambda c=compiled, ti=t_ins: c(ti))}
        y = torch.empty_like(t_ins["x"])
        results["torch copy_"] = events_us(lambda y=y, x=t_ins["x"]: y.copy_(x))
        f = norm_graph(kind, dtype)
        ins = {k: cp.asarray(v.view(np.uint16) if dtype == "bfloat16" else v) for k, v in host.items()}
        eng.run(f, ins)
        results["segfuse"] = rt.kernel_time_us(f, ins, reps=20)
        errs = {}
        vec = 4 if dtype == "float32" else 8
        names, src = [], SOURCE
        for mode in MODES:
            for T in THREADS:
                if D % (vec * T):
                    continue
                name = f"k_{mode}_{T}"
                names.append((f"{mode}/{T}", name))
                src += kernel_source(name, dtype, T, D, mode, kind == "layernorm")
        mod = cp.RawModule(code=src, options=("-std=c++17",))
        for label, name in names:
            k = mod.get_function(name)
            T = int(label.split("/")[1])
            args = tuple(t_ins[n].data_ptr() for n in ("x", "w", "b")) + (y.data_ptr(),)
            args = tuple(np.uint64(a) for a in args)
            results[label] = events_us(lambda k=k, T=T, R=R, args=args: k((R,), (T,), args))
            if not label.startswith("copy"):
                errs[label] = float((y.float() - want).abs().max())
        base = results["torch.compile"]
        for label, us in results.items():
            err = f", max err {errs[label]:.2e}" if label in errs else ""
            print(f"{spec} {label:14s} {us:8.1f} us  torch.compile/this {base / us:.3f}x{err}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
