"""The compile check (tests/compile_check.py) can fail: a module that does not compile is reported
with its graph, a bad source in a batch is found among good ones, and sources that compiled
before are not compiled again."""

from __future__ import annotations

import pytest

pytest.importorskip("cuda.bindings.nvrtc")

import compile_check  # noqa: E402
from helpers.graphs import topk_scatter  # noqa: E402
from segfuse.compiler.codegen.prelude import PRELUDE  # noqa: E402
from segfuse.compiler.cuda import prepare  # noqa: E402
from segfuse.compiler.cuda.nvrtc import default_options  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402


def plans_of(graph: dict) -> dict:
    f = Fusion.from_json(graph)
    shapes = {i["name"]: tuple(i["shape"]) for i in graph["inputs"]}
    return {"k": (f, f.bind(shapes), Engine().plan(f, shapes), "test_x")}


def test_a_bad_source_is_found_in_a_batch_of_good_ones():
    good = [(f"g{k}", PRELUDE + f'extern "C" __global__ void sf_ok_{k}(int* p) {{ p[0] = {k}; }}\n') for k in range(5)]
    bad = ("b", PRELUDE + 'extern "C" __global__ void sf_bad(int* p) { p[0] = v0; }\n')
    errors = compile_check.compile_all(good[:3] + [bad] + good[3:], default_options("sm_90"), 1)
    assert list(errors) == ["b"]
    assert 'identifier "v0" is undefined' in errors["b"] and "warning" not in errors["b"]


def test_a_plan_whose_module_does_not_compile_fails_with_its_graph(monkeypatch, tmp_path):
    monkeypatch.setenv("SEGFUSE_COMPILE_CHECK_CACHE", str(tmp_path))
    real = prepare.generate

    def broken(*args, **kw):
        m = real(*args, **kw)
        m.source += "\nint sf_broken = undefined_thing;\n"
        return m

    monkeypatch.setattr(prepare, "generate", broken)
    report = compile_check.check(plans_of(topk_scatter(1024)), jobs=1)
    assert report["failures"] and report["compiled"] == len(report["kernels"]) > 0
    f = report["failures"][0]
    assert "does not compile" in f["what"] and f["test"] == "test_x" and '"topk"' in f["graph"]
    assert "undefined_thing" in f["error"] and "[128, 1024]" in f["inputs"]
    assert not list(tmp_path.iterdir())  # nothing that failed is remembered


def test_sources_that_compiled_are_not_compiled_again(monkeypatch, tmp_path):
    monkeypatch.setenv("SEGFUSE_COMPILE_CHECK_CACHE", str(tmp_path))
    plans = plans_of(topk_scatter(1024))
    first = compile_check.check(plans, jobs=1)
    assert not first["failures"] and first["compiled"] == len(first["kernels"]) > 1 and first["cached"] == 0
    again = compile_check.check(plans, jobs=1)
    assert again["compiled"] == 0 and again["cached"] == first["compiled"]


def test_the_fallback_lowering_is_checked_too():
    """Besides the preparation's modules, the split lowering a compile failure falls back to."""
    f, bound, plan, _ = plans_of(topk_scatter(1024))["k"]
    primary = {m.source for _, m in prepare.modules_without_device(f, plan, bound)}
    every = {m.source for _, m in compile_check.plan_modules(f, bound, plan)}
    assert primary < every


def test_library_radix_sorts_sort_epilogues_and_view_inputs_are_checked_too():
    """A row too long for one block goes to the library radix sort, the MoE argsort with its
    consumers to the fused sort-epilogue kernel, and inputs that are views get kernels of their own
    strides: the check compiles each, and says which kind each module is."""
    from corpus import moe_graphs

    long_sort = {"format": "segfuse.fusion/1", "name": "long_sort",
                 "inputs": [{"name": "x", "dtype": "float32", "shape": [1 << 17]}],
                 "ops": [{"op": "argsort", "out": "i", "inputs": ["x"], "dim": 0}], "outputs": ["i"]}
    moe, _ = moe_graphs(idt="int64")[-1]

    def planned(graph, shapes):
        f = Fusion.from_json(graph)
        return f, f.bind(shapes), Engine().plan(f, shapes), "test_x"

    plans = {"long": planned(long_sort, {"x": (1 << 17,)}), "moe": planned(moe, {"topk_ids": (4096, 8)}),
             "topk": plans_of(topk_scatter(1024))["k"]}
    kinds = {}
    for f, bound, plan, _ in plans.values():
        for kind, _sid, src, _n in compile_check.plan_sources(f, bound, plan):
            kinds.setdefault(kind, set()).add(src)
    assert set(kinds) == set(compile_check.KINDS)
    assert kinds["strided"] - kinds["plan"]  # kernels that read the view inputs differ from the contiguous ones
    report = compile_check.check({k: plans[k] for k in ("long", "moe")}, jobs=1)
    assert not report["failures"] and {"radix sort", "sort epilogue"} <= set(report["kinds"].values())
