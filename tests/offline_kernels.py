"""Every kernel a graph's plans generate, compiled offline with NVRTC for sm_90 (no GPU): the
segmenter's plan, and the forced grid-mode (one segment per anchor) and single-block lowerings;
a segment the codegen refuses is split per anchor as the runtime does. For the op tests of issue 15."""

from __future__ import annotations

import numpy as np
from corpus import modules_for
from segfuse.compiler.codegen.lazy import Unsupported
from segfuse.compiler.codegen.segment import generate
from segfuse.compiler.engine import Engine
from segfuse.compiler.plan import Segment, SegmentKind
from segfuse.compiler.segmenter.reference import split_nodes


def sources(fusion, inputs: dict) -> set[str]:
    shapes = {k: np.shape(v) for k, v in inputs.items()}
    types = fusion.bind(shapes).types
    out = set()
    for mode in ("grid", "block"):
        out |= {m.source for m in modules_for(fusion, inputs, mode) if not isinstance(m, Unsupported)}
    for seg in Engine("numpy").plan(fusion, shapes).segments:
        if not seg.nodes:
            continue
        try:
            out.add(generate(fusion, seg, types, single_block=seg.kind.value == "single_block").source)
        except Unsupported:
            for nodes, ins, outs in split_nodes(fusion, seg.nodes, seg.inputs, seg.outputs):
                try:
                    out.add(generate(fusion, Segment(0, SegmentKind.pointwise, nodes, ins, outs, "split"), types).source)
                except Unsupported:
                    pass
    return out


def compile_sources(srcs, batch: int = 48) -> int:
    """Compiles the kernels, many to one NVRTC program (one prelude each; kernel names are hashes of
    their bodies, so they do not clash); raises CompileError with NVRTC's log. Returns how many."""
    from segfuse.compiler.codegen.prelude import one_program
    from segfuse.compiler.cuda.nvrtc import compile_cubin

    items = sorted(set(srcs))
    for k in range(0, len(items), batch):
        cubin, _ = compile_cubin(one_program(items[k:k + batch]))
        assert cubin[:4] == b"\x7fELF"
    return len(items)


def compile_all(fusion, inputs: dict) -> int:
    """Compiles every kernel of the graph's plans (see `sources`); returns how many there were."""
    return compile_sources(sources(fusion, inputs))
