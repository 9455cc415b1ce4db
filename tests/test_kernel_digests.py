"""Golden sha256 of every CUDA source the corpus and the examples generate (issue 14): a refactor of
the planner or the code generator must emit byte-identical kernels, so kernel-cache keys (the sha256
of the source, compiler/cuda/cache.py) stay the same. Pure Python, no GPU, no NVRTC.

Covered, per graph and input shapes (key: graph | shapes | what | segment index):
- `plan`: the segmenter's plan (Engine("numpy").plan) with `generate` per segment, as
  tests/test_codegen_compile.py does; a sort-epilogue segment (`Segment.sort_epilogue`) digests the
  fused radix-sort source that codegen's sort_epilogue.render and radix_sort.source produce from it;
- `runs`: what the CUDA runtime's preparation of that plan compiles for contiguous inputs
  (compiler/cuda/prepare.py `modules_without_device`: views made without kernels, split pieces of
  segments the codegen refuses); key suffix `<segment id>.<module>`, `view` for a segment that
  compiles nothing;
- `grid` / `block`: the corpus's forced lowerings (corpus.modules_for, block mode skipped for the
  pw_/mv_ cases like the compile test);
- `radix|<dtype>`: the library radix sort's plain template per key dtype;
- `norm/<graph>`: the row normalizations of tests/norm_graphs.py (issue 20) at NORM_SHAPES: rows in
  registers (with the evict-last loads), few rows, a row split over a cluster, rows in shared
  memory, rows re-read from global memory, a warp a row.
A segment the codegen refuses is stored as "unsupported" (the runtime splits it).
Not covered: what only the CUDA runtime derives from real arrays (input strides of non-contiguous
inputs).

A kernel changed on purpose: regenerate with
    SEGFUSE_UPDATE_DIGESTS=1 python -m pytest tests/test_kernel_digests.py
and say in the commit which kernels changed and why.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
from corpus import all_cases, case_inputs, modules_for, moe_graphs
from norm_graphs import NORMS, norm_graph
from segfuse.compiler.codegen import radix_sort, sort_epilogue
from segfuse.compiler.codegen.lazy import Unsupported
from segfuse.compiler.codegen.segment import generate
from segfuse.compiler.cuda.arrays import cp_dtype
from segfuse.compiler.cuda.prepare import modules_without_device
from segfuse.compiler.engine import Engine
from segfuse.compiler.ir import Fusion

ROOT = Path(__file__).resolve().parents[1]
DIGESTS = Path(__file__).resolve().parent / "data" / "kernel_digests.json"
UNSUPPORTED = "unsupported"
# Symbol sizes the examples are planned at: decode-sized and benchmark-sized.
EXAMPLE_ENVS = [{"T": 128, "K": 8, "N": 4096, "M": 64, "E": 256},
                {"T": 65536, "K": 8, "N": 1 << 26, "M": 1 << 24, "E": 256}]
# (R, D) of the row normalizations: registers at 32768 rows, few rows, a split row, shared memory, re-read, a warp a row
NORM_SHAPES = [(32768, 4096), (8, 4096), (8, 65536), (200, 40000), (100, 40000), (32768, 512)]


def _sha(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _sig(shapes: dict) -> str:
    return ",".join(f"{k}={'x'.join(map(str, v)) or '()'}" for k, v in sorted(shapes.items()))


def _plan_digests(eng, f: Fusion, shapes: dict, name: str, out: dict) -> None:
    types = f.bind(shapes).types
    base = f"{name}|{_sig(shapes)}|plan"
    for i, seg in enumerate(eng.plan(f, shapes).segments):
        if not seg.nodes:
            continue  # a copy segment: no generated kernel
        m = seg.sort_epilogue
        if m is not None:
            epi, _ = sort_epilogue.render(f, m, types)
            out[f"{base}|{i}|sort_epilogue"] = _sha(radix_sort.source(np.dtype(cp_dtype(types[m.key].dtype)), epi)[0])
            continue
        try:
            src = generate(f, seg, types, single_block=seg.kind.value == "single_block").source
        except Unsupported:
            src = None
        out[f"{base}|{i}"] = UNSUPPORTED if src is None else _sha(src)
    plan = eng.plan(f, shapes)
    mods: dict = {}
    for sid, m in modules_without_device(f, plan, f.bind(shapes)):
        mods.setdefault(sid, []).append(m)
    for seg in plan.segments:
        if seg.fused_sort:
            continue  # (digested above)
        for k, m in enumerate(mods.get(seg.id, [])):
            out[f"{name}|{_sig(shapes)}|runs|{seg.id}.{k}"] = _sha(m.source)
        if seg.nodes and not mods.get(seg.id):
            out[f"{name}|{_sig(shapes)}|runs|{seg.id}"] = "view"


def compute() -> dict[str, str]:
    out: dict[str, str] = {}
    eng = Engine("numpy")
    for case in all_cases():
        f = Fusion.from_json(case[1])
        ins = case_inputs(case)
        shapes = {k: tuple(np.shape(v)) for k, v in ins.items()}
        for mode in ("grid", "block"):
            if mode == "block" and case[0].startswith(("pw_", "mv_")):
                continue
            for i, m in enumerate(modules_for(f, ins, mode)):
                out[f"{case[0]}|{_sig(shapes)}|{mode}|{i}"] = UNSUPPORTED if isinstance(m, Unsupported) else _sha(m.source)
        _plan_digests(eng, f, shapes, case[0], out)
    for idt in ("int64", "int32"):  # the benchmark sizes of the MoE fusions
        for g, _ in moe_graphs(idt=idt):
            f = Fusion.from_json(g)
            for T in (4096, 65536):
                shapes = {"topk_ids": (T, 8)} if "topk_ids" in f.input_names else {"tokens_per_expert": (256,)}
                _plan_digests(eng, f, shapes, f"{g['name']}_{idt}", out)
    for path in sorted((ROOT / "examples").glob("*.json")):
        f = Fusion.from_json(path.read_text())
        for env in EXAMPLE_ENVS:
            shapes = f.input_shapes({s: env[s] for s in f.symbols})
            _plan_digests(eng, f, {k: tuple(v) for k, v in shapes.items()}, f"examples/{path.name}", out)
    for kind in NORMS:
        for dtype in ("float32", "bfloat16"):
            for composite in ((False, True) if "softmax" in kind else (False,)):
                f = norm_graph(kind, dtype, composite)
                for R, D in NORM_SHAPES:
                    shapes = {k: tuple(v) for k, v in f.input_shapes({"R": R, "D": D}).items()}
                    _plan_digests(eng, f, shapes, f"norm/{f.name}", out)
    for dt in sorted(radix_sort._DTYPES):
        out[f"radix|{dt}"] = _sha(radix_sort.source(np.dtype(dt))[0])
    return dict(sorted(out.items()))


def test_kernel_sources_unchanged():
    now = compute()
    if os.environ.get("SEGFUSE_UPDATE_DIGESTS") == "1":
        DIGESTS.write_text(json.dumps(now, indent=1) + "\n")
    stored = json.loads(DIGESTS.read_text())
    changed = sorted(k for k in set(now) & set(stored) if now[k] != stored[k])
    added, gone = sorted(set(now) - set(stored)), sorted(set(stored) - set(now))
    lines = [f"changed: {k}" for k in changed] + [f"new:     {k}" for k in added] + [f"gone:    {k}" for k in gone]
    assert not lines, (f"{len(changed)} kernel source(s) changed, {len(added)} new, {len(gone)} gone "
                       f"(of {len(stored)} stored):\n" + "\n".join(lines[:200]) +
                       "\n\nIntended? Regenerate: SEGFUSE_UPDATE_DIGESTS=1 python -m pytest tests/test_kernel_digests.py")


def test_digests_cover_the_corpus():
    stored = json.loads(DIGESTS.read_text())
    kernels = {v for v in stored.values() if v != UNSUPPORTED}
    assert len(kernels) > 300, len(kernels)
    assert any(k.startswith("examples/") for k in stored) and any("|sort_epilogue" in k for k in stored)
