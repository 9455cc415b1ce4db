"""pytest plugin: every plan the test session builds compiles for sm_90 (issue 15, item 1).

The NumPy-backend tests plan graphs (random graphs, examples, every test graph) but never compile
their kernels; the offline compile test (test_codegen_compile.py) covers a fixed corpus only. This
plugin records every plan the segmenter makes during the session (`segment`, wrapped at configure
time: the Engine's plan cache, tests that call it themselves, every capability) with its fusion
and input types. At the session's end, for each distinct (graph, input types, plan):

- the modules a CUDA preparation of the plan compiles (`prepare.modules_without_device`: the
  runtime's own decisions -- aliases, copies, splits, the sort epilogue -- for contiguous inputs,
  without a GPU), and
- the modules of the lowering a compile failure falls back to (each segment split per anchor,
  `prepare._split_step`),
- the same preparation for inputs that are views (the kernels a run compiles when its inputs are
  not contiguous: every input of rank >= 2 transposed, of rank 1 every other element), and
- the library radix sorts the preparation hands segments to (compiler/cuda/radix_sort.py): the
  plain multi-block sort of each key dtype a library argsort takes, and the fused sort-epilogue
  variant of each sort-epilogue segment (compiler/codegen/sort_epilogue.py),

are generated and every distinct source is compiled with NVRTC (cuda.bindings) for sm_90, in
batches of one prelude each, skipping sources that compiled before (a disk cache of markers keyed
by the kernel cache's sha256 key: source, options, architecture, NVRTC's version).

Under pytest-xdist each worker checks the plans of its own tests and reports to the controller.
The terminal summary says how many plans, modules and kernels were checked, and how many
modules of each kind (plan, fallback, strided, radix sort, sort epilogue); a module that does not
compile (or a plan the preparation cannot lower) fails the session with the graph, its input
types, the test that planned it and NVRTC's error.

Off with `--compile-check=off` (or SEGFUSE_COMPILE_CHECK=0); without cuda.bindings it says so and
checks nothing (`--compile-check=on` makes that an error). SEGFUSE_COMPILE_CHECK_CACHE names the
marker directory (default: $XDG_CACHE_HOME/segfuse/compile-check), SEGFUSE_COMPILE_CHECK_JOBS the
compiler processes per pytest process (default: the CPUs, shared among xdist workers).
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
import traceback

import pytest

KEY = "segfuse_compile_check"
BATCH = 32  # sources per compile unit (one prelude): ~10x faster than one unit per source
MAX_SHOWN = 5  # failures printed in full


def addoption(parser) -> None:
    parser.addoption("--compile-check", choices=("auto", "on", "off"), default=None,
                     help="compile every kernel of every plan the session builds with NVRTC for sm_90 "
                          "(auto: where cuda.bindings is installed; default auto, SEGFUSE_COMPILE_CHECK=0: off)")


def configure(config) -> None:
    mode = config.getoption("--compile-check") or ("off" if os.environ.get("SEGFUSE_COMPILE_CHECK") == "0" else "auto")
    if mode != "off":
        config.pluginmanager.register(CompileCheck(config, mode), KEY)


# ---- recording ------------------------------------------------------------------------------
class CompileCheck:
    def __init__(self, config, mode: str):
        self.config, self.mode = config, mode
        self.plans: dict = {}  # key -> (fusion, bound, plan, test id)
        self.test = "(collection)"
        self.reports: list[dict] = []  # one per process that checked (the workers, or this one)
        self.worker = hasattr(config, "workerinput")
        self.why_not = _unavailable()
        if self.why_not and mode == "on":
            raise pytest.UsageError(f"--compile-check=on: {self.why_not}")
        self._install()

    def _install(self) -> None:
        from segfuse.compiler import segmenter
        from segfuse.compiler.segmenter import cache, pipeline

        original = getattr(pipeline.segment, "__wrapped__", pipeline.segment)

        @functools.wraps(original)
        def recording_segment(fusion, bound, *args, **kw):
            plan = original(fusion, bound, *args, **kw)
            try:
                self.record(fusion, bound, plan, (args, kw))
            except Exception:  # never a test's failure: the check reports what it could not record
                self.plans[("unrecordable", len(self.plans))] = (None, None, traceback.format_exc(), self.test)
            return plan

        for mod in (pipeline, segmenter, cache):
            mod.segment = recording_segment

    def record(self, fusion, bound, plan, cap) -> None:
        sig = tuple((n, tuple(bound.types[n].shape), bound.types[n].dtype.value) for n in fusion.input_names)
        key = (fusion.id, sig, repr(cap))
        if key not in self.plans:
            self.plans[key] = (fusion, bound, plan, self.test)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.test = item.nodeid
        yield

    # ---- the check at the session's end -----------------------------------------------------
    def pytest_sessionfinish(self, session, exitstatus):
        if exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.USAGE_ERROR):
            return
        controller = not self.worker and bool(getattr(self.config.option, "numprocesses", None))
        if not controller and not self.why_not and self.plans:  # (a controller has the workers' reports)
            report = check(self.plans, _jobs(self.config))
            if self.worker:
                self.config.workeroutput[KEY] = json.dumps(report)
                return
            self.reports.append(report)
        if any(r["failures"] for r in self.reports):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_testnodedown(self, node, error):
        out = getattr(node, "workeroutput", None) or {}
        if KEY in out:
            self.reports.append(json.loads(out[KEY]))

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        if self.why_not:
            tr.write_line(f"compile check: skipped ({self.why_not})")
            return
        if not self.reports:
            return
        kernels = {k: v for r in self.reports for k, v in r["kernels"].items()}  # (workers may share modules)
        kinds = {k: v for r in self.reports for k, v in r.get("kinds", {}).items()}
        fails = [f for r in self.reports for f in r["failures"]]
        n = {k: sum(r.get(k, 0) for r in self.reports) for k in (
            "plans", "compiled", "cached", "generate_s", "generate_cpu_s", "compile_s", "compile_cpu_s")}
        per_kind = ", ".join(f"{sum(1 for v in kinds.values() if v == kind)} {kind}" for kind in KINDS)
        line = (f"compile check: {len(kernels)} distinct modules ({sum(kernels.values())} kernels; {per_kind}) "
                f"of {n['plans']} plans compiled for sm_90 with NVRTC: {n['compiled']} compiled, {n['cached']} cached; "
                f"generating {n['generate_s']:.1f} s ({n['generate_cpu_s']:.1f} s CPU), compiling "
                f"{n['compile_s']:.1f} s ({n['compile_cpu_s']:.1f} s CPU in the test processes)")
        if not fails:
            tr.write_line(line, green=True)
            return
        tr.section("compile check failures", sep="=", red=True)
        for f in fails[:MAX_SHOWN]:
            tr.write_line(f"{f['what']} (test {f['test']}, segment {f['segment']}, inputs {f['inputs']})")
            tr.write_line(f"  graph: {f['graph']}")
            tr.write_line("  " + f["error"].replace("\n", "\n  "))
        if len(fails) > MAX_SHOWN:
            tr.write_line(f"... and {len(fails) - MAX_SHOWN} more")
        tr.write_line(line + f"; {len(fails)} FAILED", red=True)


def _unavailable() -> str | None:
    try:
        from cuda.bindings import nvrtc  # noqa: F401
        from segfuse.compiler.cuda.nvrtc import available
    except Exception as e:
        return f"no NVRTC ({type(e).__name__}: {e})"
    return None if available() else "no NVRTC"


def _jobs(config) -> int:
    env = os.environ.get("SEGFUSE_COMPILE_CHECK_JOBS")
    if env:
        return max(1, int(env))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    return max(1, (os.cpu_count() or 1) // workers)


# ---- sources of a plan ----------------------------------------------------------------------
# What a module is, in the summary: the preparation's own (contiguous inputs), the split lowering a
# compile failure falls back to, the preparation for view inputs, a library radix sort, a fused
# sort-epilogue radix sort. A source counts as the first kind that produced it.
KINDS = ("plan", "fallback", "strided", "radix sort", "sort epilogue")


def plan_sources(fusion, bound, plan) -> list:
    """(kind, segment id, source, kernels) for every module a CUDA preparation of `plan` may
    compile: `plan_modules`, the preparation for view inputs (`view_strides`), and the library
    radix sorts it hands segments to."""
    from segfuse.compiler.cuda import prepare

    out = []
    with _recording_library_sorts() as sorts:
        for kind, mods in (("plan", prepare.modules_without_device(fusion, plan, bound)),
                           ("fallback", fallback_modules(fusion, bound, plan))):
            out += [(kind, sid, m.source, len(m.launches)) for sid, m in mods]
        strides = view_strides(fusion, bound)
        if strides:
            for sid, m in prepare.prepare_plan(prepare.SourcesOnly(), fusion, plan, bound, strides).modules:
                out.append(("strided", sid, m.source, len(m.launches)))
    for kind, sid, src in _radix_sources(fusion, sorts):
        out.append((kind, sid, src, 1))
    return out


def view_strides(fusion, bound) -> dict:
    """Element strides of inputs that are views: rank >= 2 transposed (column-major), rank 1 every
    other element; {} when no input has two or more elements (nothing would differ)."""
    from segfuse.compiler.cuda.arrays import contiguous_strides

    strides, views = {}, False
    for n in fusion.input_names:
        shape = tuple(bound.types[n].shape)
        if len(shape) >= 2:
            strides[n] = tuple(reversed(contiguous_strides(tuple(reversed(shape)))))
        elif len(shape) == 1:
            strides[n] = (2,)
        else:
            strides[n] = ()
        views = views or (len(shape) >= 1 and math.prod(int(d) for d in shape) > 1)
    return strides if views else {}


class _recording_library_sorts:
    """Records the segments a preparation hands to the library sorts (prepare.library_run and
    prepare.sort_epilogue_run, which compile their radix kernels only with CuPy present): a list of
    ("library" | "fused", segment, types)."""

    def __enter__(self):
        from segfuse.compiler.cuda import prepare

        self.prepare, self.saved, self.sorts = prepare, (prepare.library_run, prepare.sort_epilogue_run), []
        lib, fused = self.saved

        def library_run(rt, fusion, seg, types):
            self.sorts.append(("library", seg, dict(types)))
            return lib(rt, fusion, seg, types)

        def sort_epilogue_run(rt, fusion, seg, types, *args):
            got = fused(rt, fusion, seg, types, *args)
            if got is not None:
                self.sorts.append(("fused", seg, dict(types)))
            return got

        prepare.library_run, prepare.sort_epilogue_run = library_run, sort_epilogue_run
        return self.sorts

    def __exit__(self, *exc):
        self.prepare.library_run, self.prepare.sort_epilogue_run = self.saved
        return False


def _radix_sources(fusion, sorts) -> list:
    """(kind, segment id, source) of the radix kernels the recorded library segments launch: the
    decisions of compiler/cuda/library_sorts.py (a one-node argsort whose row the sort takes; a
    sort-epilogue segment that still matches), the text of compiler/codegen/radix_sort.py."""
    import numpy as np
    from segfuse.compiler.codegen.radix_sort import source, takes
    from segfuse.compiler.codegen.sort_epilogue import render
    from segfuse.compiler.cuda.arrays import cp_dtype
    from segfuse.compiler.ops.registry import LibrarySort

    out = []
    for how, seg, types in sorts:
        if how == "fused":
            m = seg.sort_epilogue  # the plan's record, as compiler/cuda/library_sorts.py reads it
            epi, _ = render(fusion, m, types)
            out.append(("sort epilogue", seg.id, source(np.dtype(cp_dtype(types[m.key].dtype)), epi)[0]))
            continue
        nodes = [fusion.nodes[p] for p in seg.nodes]
        nd = nodes[0] if len(nodes) == 1 else None
        if nd is None or nd.op.library_sort is not LibrarySort.indices or not isinstance(nd.inputs[0], str):
            continue
        t = types[nd.inputs[0]]
        if t.rank >= 1 and t.dtype.value != "bfloat16" and takes(t.shape, cp_dtype(t.dtype), nd.attrs.dim % t.rank):
            out.append(("radix sort", seg.id, source(np.dtype(cp_dtype(t.dtype)))[0]))
    return out


def plan_modules(fusion, bound, plan) -> list:
    """(segment id, Module) for every module a CUDA preparation of `plan` compiles, then for every
    module of its fallback lowering (each segment split per anchor)."""
    from segfuse.compiler.cuda import prepare

    return list(prepare.modules_without_device(fusion, plan, bound)) + fallback_modules(fusion, bound, plan)


def fallback_modules(fusion, bound, plan) -> list:
    """(segment id, Module) of the lowering a compile failure falls back to: each segment split
    per anchor (`prepare._split_step`), for contiguous inputs."""
    from segfuse.compiler.cuda import prepare
    from segfuse.compiler.cuda.arrays import contiguous_strides

    mods = []
    rt = prepare.SourcesOnly()
    types = dict(bound.types)
    for seg in plan.segments:
        for c in getattr(seg, "copies", []) or []:
            types.setdefault(c.dst, types[c.src])
    strides = {n: contiguous_strides(t.shape) for n, t in types.items()}
    for seg in plan.segments:
        if seg.nodes:
            prep = prepare.Prepared(plan, types, [], fusion=fusion)
            prepare._split_step(rt, fusion, seg, types, strides, prep, "compile check")
            mods += prep.modules
    return mods


def check(plans: dict, jobs: int = 1) -> dict:
    """Generate the modules of every recorded plan and compile each distinct source once."""
    from segfuse.compiler.cuda.cache import cache_key
    from segfuse.compiler.cuda.nvrtc import default_options, version

    t0, c0 = time.perf_counter(), time.process_time()
    opts, compiler = default_options("sm_90"), version()
    sources: dict[str, str] = {}  # key -> source
    where: dict[str, tuple] = {}  # key -> (fusion, bound, segment id, test)
    failures, kernels, kinds = [], {}, {}  # key -> launches of the module, its kind
    for fusion, bound, plan, test in plans.values():
        if fusion is None:  # recording itself failed
            failures.append(_failure("recording the plan failed", None, None, "-", test, plan))
            continue
        try:
            srcs = plan_sources(fusion, bound, plan)
        except Exception:
            failures.append(_failure("preparing the plan for CUDA raised", fusion, bound, "-", test,
                                     traceback.format_exc(limit=8)))
            continue
        for kind, sid, src, n_kernels in srcs:
            k = cache_key(src, opts, "sm_90", compiler)
            if k not in sources:
                sources[k] = src
                where[k] = (fusion, bound, sid, test)
                kernels[k], kinds[k] = n_kernels, kind
    cache_dir = _cache_dir()
    todo = []
    for k in sources:
        try:
            os.utime(os.path.join(cache_dir, k))  # compiled before; recently used (pruning keeps it)
        except OSError:
            todo.append(k)
    t1, c1 = time.perf_counter(), time.process_time()
    errors = compile_all([(k, sources[k]) for k in todo], opts, jobs)
    for k in todo:
        if k in errors:
            fusion, bound, sid, test = where[k]
            failures.append(_failure("a generated module does not compile", fusion, bound, sid, test, errors[k]))
        else:
            _touch(os.path.join(cache_dir, k))
    _prune(cache_dir)
    return {"plans": len(plans), "kernels": kernels, "kinds": kinds, "compiled": len(todo),
            "cached": len(sources) - len(todo), "seconds": time.perf_counter() - t0, "failures": failures,
            "generate_s": t1 - t0, "generate_cpu_s": c1 - c0, "compile_s": time.perf_counter() - t1,
            "compile_cpu_s": time.process_time() - c1}


def _failure(what, fusion, bound, sid, test, error) -> dict:
    graph = json.dumps(fusion.to_json(), separators=(",", ":")) if fusion is not None else "-"
    inputs = ({n: [list(bound.types[n].shape), bound.types[n].dtype.value] for n in fusion.input_names}
              if fusion is not None else {})
    return {"what": what, "test": test, "segment": sid, "graph": graph[:6000], "inputs": json.dumps(inputs),
            "error": str(error)[:4000]}


def _cache_dir() -> str:
    d = os.environ.get("SEGFUSE_COMPILE_CHECK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "segfuse", "compile-check")
    os.makedirs(d, exist_ok=True)
    return d


def _prune(cache_dir: str, keep: int = 50_000, days: float = 30) -> None:
    """Markers are empty files, one per source that compiled: past `keep` of them, those unused
    for `days` go (sources of old code generators)."""
    with os.scandir(cache_dir) as it:
        entries = list(it)
    if len(entries) > keep:
        cutoff = time.time() - days * 86400
        for e in entries:
            try:
                if e.stat().st_mtime < cutoff:
                    os.remove(e.path)
            except OSError:
                pass


def _touch(path: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb"):
        pass
    os.replace(tmp, path)


# ---- compiling ------------------------------------------------------------------------------
def compile_all(items: list, opts: list, jobs: int) -> dict:
    """{key: NVRTC's log} for the (key, source) items that do not compile. Sources that start
    with the prelude are compiled in batches (one prelude per unit); a batch that fails is
    compiled source by source to find the culprits."""
    from segfuse.compiler.codegen.prelude import PRELUDE

    batched = [it for it in items if it[1].startswith(PRELUDE)]
    single = [it for it in items if not it[1].startswith(PRELUDE)]
    units = [batched[i:i + BATCH] for i in range(0, len(batched), BATCH)] + [[it] for it in single]
    if jobs > 1 and len(units) > 1:
        import concurrent.futures as cf
        import multiprocessing as mp

        # processes: NVRTC holds the GIL through cuda.bindings; forkserver: the test process has threads
        with cf.ProcessPoolExecutor(min(jobs, len(units)), mp_context=mp.get_context("forkserver")) as ex:
            results = list(ex.map(_compile_unit, units, [opts] * len(units)))
    else:
        results = [_compile_unit(u, opts) for u in units]
    return {k: v for r in results for k, v in r.items()}


def _compile_unit(unit: list, opts: list) -> dict:
    from segfuse.compiler.codegen.prelude import one_program
    from segfuse.compiler.cuda.nvrtc import CompileError, compile_cubin

    src = unit[0][1] if len(unit) == 1 else one_program(s for _, s in unit)
    try:
        compile_cubin(src, opts)
        return {}
    except CompileError as e:
        if len(unit) == 1:
            return {unit[0][0]: _errors_only(e.log or str(e))}
    half = len(unit) // 2  # bisect: a few compiles find one bad source among a unit's
    return {**_compile_unit(unit[:half], opts), **_compile_unit(unit[half:], opts)}


def _errors_only(log: str) -> str:
    """NVRTC's log without its warnings (the generated code declares lambdas it may not use)."""
    keep, lines = [], log.splitlines()
    for i, ln in enumerate(lines):
        if " error" in ln or ln.startswith("error") or "errors detected" in ln:
            keep.extend(lines[i:i + 3] if "errors detected" not in ln else [ln])
    return "\n".join(keep) or log
