"""`segfuse explain --compile ARCH`: every kernel a run of the given sizes compiles, compiled with
NVRTC for ARCH on a machine without a GPU (what the GPU image's check in CI runs)."""

from __future__ import annotations

import re

from helpers.processes import ROOT, segfuse
from segfuse.compiler import Engine, load_fusion

ARGSORT = ROOT / "examples" / "moe_argsort.json"


def test_compile_builds_every_kernel_module_of_the_plan():
    shapes = {"topk_ids": (4096, 4)}
    fusion = load_fusion(str(ARGSORT))
    modules = Engine.default("numpy").kernel_modules(fusion, shapes)
    compiler, built = Engine.default("numpy").compile_offline(fusion, shapes, "sm_90")
    assert [(seg, mod.key) for seg, mod in modules] == [(seg, key) for seg, key, _ in built]
    assert built and all(size > 1000 for _, _, size in built)
    out = segfuse("explain", ARGSORT, "--shape", "T=4096", "--compile").stdout
    assert f"compiled {len(built)} kernel module(s) for sm_90 with {compiler}:" in out, out
    # --json keeps stdout JSON: the summary goes to stderr
    r = segfuse("explain", ARGSORT, "--shape", "T=4096", "--compile", "sm_100", "--json")
    assert r.stdout.lstrip().startswith("{") and re.search(r"for sm_100 with nvrtc-\d+\.\d+", r.stderr), r.stderr


def test_an_unknown_architecture_is_a_clear_error():
    r = segfuse("explain", ARGSORT, "--shape", "T=64", "--compile", "sm_1", check=2)
    assert "--compile sm_1:" in r.stderr and "NVRTC" in r.stderr, r.stderr
