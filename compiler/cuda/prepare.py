"""Preparation: a plan at one input signature becomes steps, each a `run(env, ctx)` -- a kernel
launch through its parameter block, a library sort, a copy, or (last resort) the NumPy reference on
the host -- with the plan's kernels compiled and loaded, once per signature."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import numpy as np

from ..codegen.lazy import Unsupported
from ..codegen.options import DEFAULT_OPTIONS, CodegenOptions
from ..codegen.segment import NOMINAL_SM_COUNT, generate
from ..dtypes import DType
from ..numpy_backend import eval_node
from ..plan import AliasMode, LibraryRoutine, Segment, SegmentKind
from ..segmenter.reference import split_nodes
from .arrays import contiguous_strides, host_view
from .buffers import DeviceBuffers, store
from .library_sorts import library_run, sort_epilogue_run
from .nvrtc import CompileError
from .param_blocks import kernel_step

log = logging.getLogger("segfuse.compiler")


@dataclass
class Step:
    kind: str  # kernel | view | library | host | copy | split
    seg: object
    run: object  # callable(env, ctx)
    desc: str = ""
    # a library step whose run is a kernel step's `fire(bind(env, ctx), ...)` (the fused sort)
    launches: bool = False

    @property
    def launches_only(self) -> bool:
        """Its run is `fire(bind(env, ctx), ...)` with no host work but binding (kernels, views,
        the fused sort): the fast path may bind it and replay its launches from a CUDA graph."""
        return self.kind in ("kernel", "view") or self.launches

    @property
    def fires(self) -> bool:
        """It launches a kernel (a plan of views alone has nothing to put in a CUDA graph)."""
        return self.kind == "kernel" or self.launches


@dataclass
class Prepared:
    plan: object
    types: dict
    steps: list
    compile_s: float = 0.0
    kernels: int = 0
    fallbacks: list = field(default_factory=list)
    # some kernel checks indices or divisors (writes the error word): a run must synchronize to
    # learn its outcome before it returns. Plans that cannot fail return once launched.
    may_fail: bool = False
    # inputs the plan updates in place (alias_of): a run writes a copy and commits it at the end
    staged: list = field(default_factory=list)
    outputs: tuple = ()  # the plan's Commit of each graph output (compiler/commit.py)
    plan_s: float = 0.0  # time spent preparing (compiles included)
    # (segment id, codegen Module) for every generated module compiled, in launch order: what the
    # server's plan route shows (Engine.kernel_modules)
    modules: list = field(default_factory=list)
    made: set = field(default_factory=set)  # tensors the steps so far made (inputs included)
    # what a fallback from a kernel that does not compile needs: the graph, the run's input strides
    fusion: object = None
    in_strides: dict = field(default_factory=dict)
    buffers: DeviceBuffers | None = None  # the plan's buffers at these sizes (compiler/cuda/buffers.py)
    # keys of what this entry's steps keep in thread and stream states (parameter blocks, reusable
    # buffers, run contexts): purged from every state once the entry is collected (the runtime
    # registers that with thread_state.owned_by)
    tokens: list = field(default_factory=list)
    ctx_token: object = None  # this entry's RunCtx in a stream state (compiler/cuda/external_stream.py)

    def __post_init__(self):
        self.ctx_token = self.token()

    def token(self) -> object:
        """A new key for something this entry's steps keep per state."""
        t = object()
        self.tokens.append(t)
        return t


def prepare_plan(rt, fusion, plan, bound, strides: dict) -> Prepared:
    """Steps for `plan` at the bound input sizes and dtypes and these input strides (`rt`: the
    CupyRuntime, for its kernel cache, SM count and CuPy)."""
    types = dict(bound.types)
    for seg in plan.segments:  # private copies of scatter selfs have their source's type
        for c in seg.copies:
            types.setdefault(c.dst, types[c.src])
    t0 = time.perf_counter()
    commits = plan.output_commits(fusion)
    prep = Prepared(plan, types, [], staged=[o.alias_of for o in fusion.outputs if o.alias_of is not None],
                    outputs=tuple(commits), made=set(fusion.input_names), fusion=fusion, in_strides=strides)
    c0 = rt.cache.stats.compile_s
    layout = dict(strides)  # element strides of the inputs, then of the views the plan makes
    keep = set(fusion.input_names) | {o.name for o in fusion.outputs}
    for seg in plan.segments:
        step = segment_step(rt, fusion, seg, types, layout, prep)
        drop = tuple(t for t in plan.frees.get(str(seg.id), ()) if t not in keep)
        if drop and step.run is not None:
            step.run = _then_free(step.run, drop)
        prep.steps.append(step)
        prep.made.update(seg.outputs)
    prep.buffers = DeviceBuffers(plan, types, rt.cp, prep.token())
    if prep.buffers and prep.steps and prep.steps[0].run is not None:
        prep.steps[0].run = _after_fill(prep.steps[0].run, prep.buffers.fill)
    prep.compile_s = rt.cache.stats.compile_s - c0
    prep.plan_s = time.perf_counter() - t0
    return prep


class SourcesOnly:
    """A stand-in for the CupyRuntime that compiles and loads nothing (no CuPy, no GPU):
    `prepare_plan` with it takes every decision a real preparation takes (aliases, strides,
    splits, fallbacks) and records the modules it would compile, for a device of `sm_count` SMs
    (default: the code generator's, an H200's). Its steps cannot run."""

    cp = None

    def __init__(self, sm_count: int | None = None, options: CodegenOptions = DEFAULT_OPTIONS):
        self.sm_count = sm_count if sm_count is not None else NOMINAL_SM_COUNT
        self.options = options
        self.cache = SimpleNamespace(stats=SimpleNamespace(compile_s=0.0))


def modules_without_device(fusion, plan, bound, sm_count: int | None = None,
                           options: CodegenOptions = DEFAULT_OPTIONS) -> list:
    """(segment id, codegen Module) for every module a CupyRuntime's preparation of `plan`
    compiles for contiguous inputs of the bound sizes, found without CuPy or a GPU (SourcesOnly):
    the same preparation, minus the compiles."""
    strides = {n: contiguous_strides(bound.types[n].shape) for n in fusion.input_names}
    return prepare_plan(SourcesOnly(sm_count, options), fusion, plan, bound, strides).modules


def segment_step(rt, fusion, seg, types, in_strides, prep) -> Step:
    """The step that runs one segment of the plan (its launches counted into `prep`).
    `in_strides`: the element strides of tensors that are not contiguous (inputs, views); a view
    step adds its outputs' strides there, for the kernels of later segments."""
    kind = getattr(seg.kind, "value", seg.kind)
    if not seg.nodes:
        return Step("copy", seg, _copy_step(rt, seg, types), "copy")
    if kind == "view":
        step = _view_step(rt, fusion, seg, types, in_strides)
        if step is not None:
            return step
        prep.fallbacks.append(f"segment {seg.id}: a kernel makes the view (a reshape of a non-contiguous tensor)")
    fused = sort_epilogue_run(rt, fusion, seg, types, prep.token(), in_strides, prep.token())
    if fused is not None:
        run, may_fail = fused
        prep.kernels += 1
        prep.may_fail = prep.may_fail or may_fail  # (a checked divisor writes the error word)
        return Step("library", seg, run, LibraryRoutine.sort_epilogue.describe(),
                    launches=getattr(run, "fire", None) is not None)
    # A scatter writes straight into its self's buffer only when that buffer is materialized
    # before the segment (in place, ordered, or a staged alias_of input). Otherwise the kernel
    # initializes its own output from self (which is what a private copy means).
    aliased, alias_buf = set(), {}
    graph_inputs = set(fusion.input_names)
    staged = {o.alias_of for o in fusion.outputs if o.alias_of is not None}
    for a in seg.aliases:
        if a.buffer not in seg.inputs:
            continue
        if a.buffer in graph_inputs and a.buffer not in staged:
            continue
        node = next((fusion.nodes[p] for p in seg.nodes if a.tensor in fusion.nodes[p].outputs), None)
        if node is None or (node.inputs[0] != a.buffer and a.mode is not AliasMode.copy):
            continue
        aliased.add(a.tensor)
        alias_buf[a.tensor] = a.buffer
    strides = {n: in_strides.get(n) or contiguous_strides(types[n].shape) for n in seg.inputs}
    tail = _view_outputs(fusion, seg, prep.plan, prep.made, {c.name for c in prep.outputs if c.copy})
    made_views = {nd.outputs[0] for nd in tail}
    written = [o for o in seg.outputs if o not in made_views]
    views = _views(rt, tail, types, in_strides) if tail and written else None
    gen = replace(seg, outputs=written) if views is not None else seg
    try:
        mod = generate(fusion, gen, types, strides, aliased=aliased, sm_count=rt.sm_count,
                       single_block=(kind == "single_block"), options=rt.options)
    except Unsupported as e:
        return _split_step(rt, fusion, seg, types, strides, prep, str(e))
    step = _kernel(rt, mod, types, alias_buf, prep, seg)
    if views is not None:
        in_strides.update(views[1])
        if step.run is not None:
            step.run = _then(step.run, views[0])
    return step


def _after_fill(run, fill):
    """The first step's run, after the plan's buffers are put into the run's env (every run path
    runs or binds the steps in order, so each run finds its tensors in their buffers)."""
    bind0 = getattr(run, "bind", None)

    def run_fill(env, ctx):
        fill(env, ctx)
        run(env, ctx)

    if bind0 is not None:
        def bind(env, ctx):
            fill(env, ctx)
            return bind0(env, ctx)
    else:
        bind = None
    run_fill.bind, run_fill.fire = bind, getattr(run, "fire", None)
    return run_fill


def _then_free(run, drop):
    """A step's run, then the plan's frees: the tensors whose last use this segment is leave the
    run's env, so CuPy's pool can hand their memory to later steps of the same run (stream
    ordered): a buffer allocated for this run (compiler/cuda/buffers.py) goes back once the plan
    freed every tensor in it. The CUDA-graph path binds every step before it launches and keeps
    them all."""
    def run_free(env, ctx):
        run(env, ctx)
        for t in drop:
            env.pop(t, None)

    run_free.bind, run_free.fire = getattr(run, "bind", None), getattr(run, "fire", None)
    return run_free


def _then(run, make):
    """A kernel step's run, then the views the plan makes of its outputs (or of inputs)."""
    kbind, fire = run.bind, run.fire

    def bind(env, ctx):
        rec = kbind(env, ctx)
        make(env)
        return rec

    def both(env, ctx):
        fire(bind(env, ctx), ctx.state.err_ptr, ctx.sp)

    both.bind, both.fire = bind, fire
    return both


_NO_PARAMS = (b"", None, None, True)  # a view step's "parameter block": nothing to launch


def _views(rt, nodes, types, layout):
    """(`make(env)`, strides): `make` makes each view node's output as a view of its operand's
    array with the registry's `view` function (the plan's `views`: no data moves); None when one
    would need a copy (reshaping a non-contiguous tensor). The views' element strides, which later
    kernels are compiled for, come from the same functions applied to stride-only NumPy proxies
    (`layout`: the known strides of tensors that are not contiguous)."""
    proxies = {}
    for nd in nodes:
        x, out = nd.inputs[0], nd.outputs[0]
        px = proxies.get(x)
        if px is None:
            t = types[x]
            st = layout.get(x) or contiguous_strides(t.shape)
            px = np.lib.stride_tricks.as_strided(np.zeros(1, t.dtype.np), tuple(t.shape),
                                                 tuple(d * t.dtype.itemsize for d in st), writeable=False)
        if nd.op.keeps_row_major_order and not px.flags.c_contiguous:
            return None
        proxies[out] = nd.op.view(np, px, nd.attrs, types[out])
    strides = {nd.outputs[0]: tuple(d // max(types[nd.outputs[0]].dtype.itemsize, 1)
                                    for d in proxies[nd.outputs[0]].strides) for nd in nodes}
    xp = rt.cp
    views = tuple((nd.op.view, nd.inputs[0], nd.attrs, types[nd.outputs[0]], nd.outputs[0]) for nd in nodes)

    def make(env):
        for view, x, attrs, t, out in views:
            env[out] = view(xp, env[x], attrs, t)

    return make, strides


def _no_launch(rec, err_ptr, sp):
    pass


def _view_step(rt, fusion, seg, types, layout) -> Step | None:
    """A view segment runs no kernel (None: it needs a copy, so a kernel makes it)."""
    made = _views(rt, [fusion.nodes[p] for p in seg.nodes], types, layout)
    if made is None:
        return None
    make, strides = made
    layout.update(strides)

    def bind(env, ctx):
        make(env)
        return _NO_PARAMS

    def run(env, ctx):
        make(env)

    run.bind, run.fire = bind, _no_launch
    return Step("view", seg, run if rt.cp is not None else None, "view")


def _view_outputs(fusion, seg, plan, made: set, copied: set) -> list:
    """The view nodes (in graph order) that make `seg`'s outputs which the plan lists as views of a
    tensor materialized before the segment ends: the kernel does not write them, they are views.
    Except graph outputs that the commit copies anyway (views of inputs, broadcasts): the kernel
    writing them is that copy, fused into a launch that runs anyway."""
    producer = {o: fusion.nodes[p] for p in seg.nodes for o in fusion.nodes[p].outputs}
    viewed = [o for o in seg.outputs if o in plan.views and o not in copied]
    written = made | {o for o in seg.outputs if o not in viewed}
    chain = {}
    for o in viewed:
        t, path = o, []
        while t not in written and t not in chain:
            nd = producer.get(t)
            if nd is None or nd.op.view is None:
                path = None
                break
            path.append(nd)
            t = nd.inputs[0]
        for nd in path or ():
            chain[nd.outputs[0]] = nd
    return sorted(chain.values(), key=lambda nd: nd.index)


def _kernel(rt, mod, types, alias_buf, prep, seg) -> Step:
    if rt.cp is None:  # SourcesOnly: nothing to load
        _count_module(prep, mod, seg)
        return Step("kernel", seg, None, mod.key)
    try:
        rawmod = rt.cache.get(mod.source, mod.options)
        kernels = []
        for ln in mod.launches:
            k = rawmod.get_function(ln.kernel)
            if ln.smem > 48 * 1024:
                k.max_dynamic_shared_size_bytes = ln.smem
            kernels.append((k, ln))
    except _compile_errors(rt) as e:
        return _compile_fallback(rt, mod, types, prep, seg, e)
    _count_module(prep, mod, seg)
    return Step("kernel", seg, kernel_step(rt, mod, kernels, types, alias_buf, prep.token()), mod.key)


def _count_module(prep, mod, seg) -> None:
    prep.kernels += sum(1 for ln in mod.launches if ln.vector_of is None)  # (a vector variant replaces its scalar twin)
    prep.may_fail = prep.may_fail or mod.may_fail
    prep.modules.append((seg.id, mod))


# ---- kernels that do not compile --------------------------------------------------------------
# Fallbacks from a generated module that failed to compile, by the lowering taken instead, for the
# whole process (the server's segfuse_compile_fallbacks metric); each failing source is logged once.
_FALLBACKS: dict = {}
_LOGGED: set = set()
_FALLBACK_LOCK = threading.Lock()
SPLIT = "split"  # a segment's pieces (one per anchor), or the seg's reason for a piece


def compile_fallbacks() -> dict:
    """{lowering taken: count} over the process, for a module that did not compile: "split"
    (the segment as one launch per anchor), "library" (a CuPy routine) or "host" (NumPy)."""
    with _FALLBACK_LOCK:
        return dict(_FALLBACKS)


def _compile_errors(rt) -> tuple:
    """The exceptions a compile failure raises: NVRTC's through cuda.bindings, CuPy's own where
    CuPy compiles (no cuda.bindings)."""
    cupy_err = getattr(getattr(getattr(rt.cp, "cuda", None), "compiler", None), "CompileException", None)
    return (CompileError, cupy_err) if isinstance(cupy_err, type) else (CompileError,)


def _first_error(e: BaseException) -> str:
    """The first error line of a compiler log (or the message): what a fallback records."""
    text = getattr(e, "log", "") or str(e)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return next((ln for ln in lines if "error" in ln), lines[0] if lines else type(e).__name__)[:200]


def _compile_fallback(rt, mod, types, prep, seg, err) -> Step:
    """The step for a segment (or a piece of a split one) whose module failed to compile: a plan
    segment is split per anchor (`_split_step`, as for a segment the codegen refuses); a piece
    that still does not compile runs as a CuPy routine or on the host. Logs the source once.
    Raises a one-line CompileError only where no lowering exists (no compiler at all, no graph)."""
    what = _first_error(err)
    fusion = prep.fusion
    if fusion is None or not seg.nodes or (isinstance(err, CompileError) and not err.source and not err.log):
        raise CompileError(f"segment {seg.id}: no lowering compiles ({what})") from None
    with _FALLBACK_LOCK:
        first = mod.key not in _LOGGED
        _LOGGED.add(mod.key)
    if first:
        log.warning("kernel %s (segment %d of graph '%s') does not compile, falling back: %s\n%s\n%s",
                    mod.key, seg.id, fusion.name, what, getattr(err, "log", "") or err, mod.source)
    why = f"kernel {mod.key} does not compile: {what}"
    if seg.reason != SPLIT:
        lowering = SPLIT
        strides = {n: prep.in_strides.get(n) or contiguous_strides(types[n].shape) for n in seg.inputs}
        step = _split_step(rt, fusion, seg, types, strides, prep, why)
    else:
        lib = library_run(rt, fusion, seg, types)
        lowering = "library" if lib is not None else "host"
        prep.fallbacks.append(f"segment {seg.id}: {lowering} ({why})")
        step = Step(lowering, seg, lib if lib is not None else _host_step(rt, fusion, seg, types), why)
    with _FALLBACK_LOCK:
        _FALLBACKS[lowering] = _FALLBACKS.get(lowering, 0) + 1
    return step


def _split_step(rt, fusion, seg, types, strides, prep, why) -> Step:
    """The segment as several launches: one per anchor (grid mode), CuPy or host for the rest.
    No piece writes in place (a scatter initializes its result from self), so the segment's
    private copies may read their sources at the end: those that later segments read run last (a
    lazily computed source is materialized for them); a piece's scatter reads its self's source in
    place of a copy made here, and the copy an earlier segment made in place of its source."""
    copies = [(c.src, c.dst) for c in seg.copies if c.dst in seg.outputs]
    dsts = {d for _, d in copies}
    outs = [o for o in seg.outputs if o not in dsts]
    outs += list(dict.fromkeys(s for s, _ in copies if s not in seg.inputs and s not in outs))
    reads = [a for a in seg.aliases if a.mode is AliasMode.copy and a.buffer in seg.inputs]
    subs = []
    for nodes, ins, gouts in split_nodes(fusion, seg.nodes, seg.inputs, outs):
        made = {o for p in nodes for o in fusion.nodes[p].outputs}
        als = [a for a in reads if a.tensor in made]
        ins = ins + [a.buffer for a in als if a.buffer not in ins]
        sub = Segment(seg.id, SegmentKind.pointwise, nodes, ins, gouts, SPLIT, aliases=als)
        try:
            mod = generate(fusion, sub, types, {n: strides.get(n) or contiguous_strides(types[n].shape) for n in ins},
                           sm_count=rt.sm_count, single_block=False, options=rt.options)
            subs.append(_kernel(rt, mod, types, {}, prep, sub))
        except Unsupported as e:
            lib = library_run(rt, fusion, sub, types)
            anchor = fusion.nodes[nodes[-1]] if nodes else None
            if lib is None and anchor is not None and anchor.op.library_sort is not None and len(nodes) > 1:
                # materialize the sort's (lazily computed) input with a kernel, then CuPy sorts it
                x = anchor.inputs[0]
                if x not in ins:
                    pre = Segment(seg.id, SegmentKind.pointwise, nodes[:-1], ins, [x], SPLIT)
                    pmod = generate(fusion, pre, types, {n: strides.get(n) or contiguous_strides(types[n].shape) for n in ins},
                                    sm_count=rt.sm_count, single_block=False, options=rt.options)
                    subs.append(_kernel(rt, pmod, types, {}, prep, pre))
                one = Segment(seg.id, SegmentKind.library, [nodes[-1]], [x], gouts, SPLIT)
                lib = library_run(rt, fusion, one, types)
            prep.kernels += 1  # a library call or a host step counts as one launch, as in the plan
            if lib is not None:
                prep.fallbacks.append(f"segment {seg.id}: library ({e})")
                subs.append(Step("library", sub, lib, str(e)))
            else:
                prep.fallbacks.append(f"segment {seg.id}: host ({e})")
                subs.append(Step("host", sub, _host_step(rt, fusion, sub, types), str(e)))
    if copies:
        subs.append(Step("copy", seg, _copy_pairs(copies), "copy"))
    prep.fallbacks.append(f"segment {seg.id}: split into {len(subs)} launches ({why})")

    def run(env, ctx):
        for s in subs:
            s.run(env, ctx)

    return Step("split", seg, run, why)


def _copy_pairs(pairs):
    def run(env, ctx):
        for i, o in pairs:
            dst = env.get(o)
            if dst is not None and dst.shape == env[i].shape and dst.dtype == env[i].dtype:
                dst[...] = env[i]  # into its plan buffer
            else:
                env[o] = env[i].copy()

    return run


def _copy_step(rt, seg, types):
    pairs = [(c.src, c.dst) for c in seg.copies] or list(zip(seg.inputs, seg.outputs))
    return _copy_pairs(pairs)


def _host_step(rt, fusion, seg, types):
    """Last resort: the NumPy references on the host (exact semantics, slow)."""
    cp = rt.cp
    reads = {a.tensor: a.buffer for a in seg.aliases if a.mode is AliasMode.copy}
    nodes = [fusion.nodes[p] for p in seg.nodes]
    nodes = [dataclasses.replace(nd, inputs=(reads[nd.outputs[0]],) + tuple(nd.inputs[1:])) if nd.outputs[0] in reads
             else nd for nd in nodes]

    def run(env, ctx):
        values = {}
        for n in seg.inputs:
            values[n] = host_view(cp.asnumpy(env[n], stream=ctx.stream), types[n].dtype)
        ctx.stream.synchronize()
        for nd in nodes:
            for x in nd.inputs:
                if isinstance(x, str) and x not in values:
                    values[x] = host_view(cp.asnumpy(env[x], stream=ctx.stream), types[x].dtype)
            eval_node(nd, values, types)
        for o in seg.outputs:
            h = np.require(values[o], requirements="C")  # keeps 0-d (ascontiguousarray makes 1-d)
            if types[o].dtype is DType.bfloat16:
                h = h.view(np.uint16)
            store(env, o, cp.asarray(h))

    return run
