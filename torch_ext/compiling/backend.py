"""The backend `segfuse`: Inductor's `compile_fx` with segfuse's subgraphs taken out of each
forward graph (partition.py), or AOTAutograd with no compiler for the rest (`"segfuse.rest": "eager"`).

The graph is decomposed with capture's table, so it holds the ATen ops capture's lowerings know;
after the rewrite it is traced again with Inductor's own table (`_inductor_ready`), so Inductor gets
the ops it would have had from `backend="inductor"`.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from dataclasses import dataclass

import torch
import torch.fx

from ..capturing import decompositions
from .partition import log, log_stats, take_subgraphs

REST = ("inductor", "eager")
FALLBACK = ("error", "eager")


# ---- decompositions -------------------------------------------------------------------------
@functools.cache
def capture_decompositions() -> dict:
    """The decompositions `segfuse.torch.capture` applies (torch.export's, less the ops segfuse
    lowers whole): the graphs `take_subgraphs` sees hold the ATen ops capture sees."""
    return decompositions().materialize()


def _inductor_ready(gm: torch.fx.GraphModule, example_inputs, rewritten: bool) -> torch.fx.GraphModule:
    """`gm` traced again with Inductor's decompositions (the ops it would have had from
    `backend="inductor"`), with fresh values (node.meta["val"]) after a rewrite. As it is when
    neither is needed."""
    from torch._guards import detect_fake_mode
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    table = select_decomp_table()
    if not rewritten and not any(n.op == "call_function" and n.target in table for n in gm.graph.nodes):
        return gm
    fake_mode = detect_fake_mode(example_inputs)
    with fake_mode if fake_mode is not None else contextlib.nullcontext(), torch.fx.traceback.preserve_node_meta():
        new = make_fx(torch.fx.Interpreter(gm).run, decomposition_table=table,
                      tracing_mode="real" if fake_mode is not None else "fake")(*example_inputs)
    new.graph.eliminate_dead_code()
    new.recompile()
    # what Inductor's compile_fx put on the graph before calling us (user_visible_output_idxs, ...)
    old_out, new_out = gm.graph.output_node(), new.graph.output_node()
    new_out.meta.update({k: v for k, v in old_out.meta.items() if k not in new_out.meta})
    new.meta.update(gm.meta)
    return new


# ---- the two ways to run the rest -----------------------------------------------------------
def _inner_compile(gm, example_inputs, *, min_ops: int, **kwargs):
    """compile_fx's inner compile: segfuse's subgraphs out of forward graphs, then Inductor's."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table

    rewritten = False
    if not kwargs.get("is_backward", False):
        stats = take_subgraphs(gm, graph="inference" if kwargs.get("is_inference") else "forward",
                               min_ops=min_ops, rest="inductor")
        log_stats(stats)
        rewritten = bool(stats.subgraphs)
    gm = _inductor_ready(gm, example_inputs, rewritten)
    if "get_decomp_fn" in kwargs or "get_decomp_fn" in getattr(_compile_fx_kwargs(), "__annotations__", {}):
        kwargs["get_decomp_fn"] = select_decomp_table  # (torch without the argument lowers with this table)
    return compile_fx_inner(gm, example_inputs, **kwargs)


def _compile_fx_kwargs():
    """The keyword arguments compile_fx_inner takes in this torch (a TypedDict), or None."""
    from torch._inductor import compile_fx

    return getattr(compile_fx, "_CompileFxKwargs", None)


def _compile_inductor(gm, example_inputs, settings: _Settings):
    from torch._functorch import config as functorch_config
    from torch._inductor.compile_fx import compile_fx

    # AOTAutograd's cache would skip `_inner_compile`, and with it the registration of the
    # segfuse ops its cached code calls
    with functorch_config.patch(enable_autograd_cache=False):
        return compile_fx(gm, example_inputs, inner_compile=functools.partial(_inner_compile, min_ops=settings.min_ops),
                          config_patches=settings.inductor_config, decompositions=capture_decompositions())


def _compile_eager(gm, example_inputs, settings: _Settings):
    """AOTAutograd with segfuse's subgraphs taken out of the forward graph, the rest run by ATen."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._functorch import config as functorch_config

    def forward(g, example, *, graph):
        log_stats(take_subgraphs(g, graph=graph, min_ops=settings.min_ops, rest="eager"))
        return boxed_nop(g, example)

    with functorch_config.patch(enable_autograd_cache=False):
        return aot_autograd(
            fw_compiler=functools.partial(forward, graph="forward"),
            inference_compiler=functools.partial(forward, graph="inference"),
            bw_compiler=boxed_nop, decompositions=capture_decompositions(),
            keep_inference_input_mutations=True)(gm, example_inputs)


# ---- the backend ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Settings:
    rest: str
    fallback: str
    min_ops: int
    inductor_config: dict  # Inductor's config patches: mode's and the options'


def _settings(mode, options) -> _Settings:
    options = dict(options or {})
    rest = options.pop("segfuse.rest", "inductor")
    fallback = options.pop("segfuse.fallback", "error")
    min_ops = options.pop("segfuse.min_ops", 2)
    if rest not in REST:
        raise ValueError(f"options['segfuse.rest']: {rest!r} is not one of {', '.join(map(repr, REST))}")
    if fallback not in FALLBACK:
        raise ValueError(f"options['segfuse.fallback']: {fallback!r} is not one of {', '.join(map(repr, FALLBACK))}")
    if not isinstance(min_ops, int) or isinstance(min_ops, bool) or min_ops < 1:
        raise ValueError(f"options['segfuse.min_ops']: {min_ops!r} is not a positive integer")
    unknown = sorted(k for k in options if k.startswith("segfuse."))
    if unknown:
        raise ValueError(f"options[{unknown[0]!r}]: unknown (segfuse's options: segfuse.rest, segfuse.fallback, "
                         "segfuse.min_ops)")
    # the mode and the other options as backend="inductor" reads them (checked, and CUDA graphs' setup)
    config = dict(torch._TorchCompileInductorWrapper(mode, options, None).config)
    if rest == "eager" and (config or mode not in (None, "default")):
        log.warning("segfuse.rest='eager': mode=%r and Inductor's options %s do not apply", mode, sorted(options))
    return _Settings(rest, fallback, min_ops, config)


def segfuse_backend(gm: torch.fx.GraphModule, example_inputs, *, mode: str | None = None,
                    options: dict | None = None):
    """The `torch.compile` backend `"segfuse"` (see the module's docstring)."""
    settings = _settings(mode, options)
    if settings.rest == "eager":
        return _compile_eager(gm, example_inputs, settings)
    original = copy.deepcopy(gm) if settings.fallback == "eager" else None  # (compile_fx may change gm)
    try:
        return _compile_inductor(gm, example_inputs, settings)
    except Exception as e:
        from torch._dynamo.exc import RestartAnalysis

        if original is None or isinstance(e, RestartAnalysis):  # (dynamo's own control flow)
            raise
        log.warning("Inductor could not compile a graph (%s: %s); with segfuse.fallback='eager' it runs op by op, "
                    "its segfuse subgraphs as segfuse ops", type(e).__name__, e)
        return _compile_eager(original, example_inputs, settings)


def _reset() -> None:
    """torch._dynamo.reset(): drop CUDA graph trees recorded for compiled graphs (as Inductor's does)."""
    if torch.cuda.is_available():
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees

        reset_cudagraph_trees()


segfuse_backend.reset = _reset
