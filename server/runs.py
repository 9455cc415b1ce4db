"""Running a fusion for an infer/execute request.

Order of work, each step able to fail without side effects:
parse and decode the request (server/run_request.py) -> admit into the run queue (429) -> pin
buffers (waits for conflicting DELETEs/overwrites/runs) -> check buffers, bind shapes, reserve
output bytes -> plan a cold run on the planning threads under the work budget, check the memory
it needs (server/run_limits.py; 413) -> run in a batch (on the event loop for warm runs on small
inputs, else on a run worker) -> only then bind outputs to buffer names.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

from segfuse.compiler import Fusion

from . import region_io, run_limits
from .errors import ApiError, conflict, not_found, too_large, unprocessable
from .protocol import check_started_in_time
from .run_request import RunPlan
from .tensors import kserve_name, nbytes_of

if TYPE_CHECKING:
    from .runtime import Runtime


def _check_pinned(rt: Runtime, plan: RunPlan) -> tuple[dict, dict]:
    """With every pin held: buffers exist and agree with what the request declares, and outputs
    may be stored where asked. Returns the inputs' shapes and dtypes."""
    store = rt.store
    shapes, dtypes = {}, {}
    for i in plan.inputs:
        if i.buffer is not None:
            b = store.get(i.buffer)
            if b is None:
                raise not_found("buffer", i.buffer, i.loc + ["parameters", "buffer"])
            if i.dtype is not None and i.dtype is not b.dtype:
                raise unprocessable(f"input '{i.name}' declares {kserve_name(i.dtype)} but buffer "
                                    f"'{i.buffer}' holds {kserve_name(b.dtype)}", i.loc + ["datatype"])
            if i.shape is not None and tuple(i.shape) != b.shape:
                raise unprocessable(f"input '{i.name}' declares shape {list(i.shape)} but buffer "
                                    f"'{i.buffer}' has shape {list(b.shape)}", i.loc + ["shape"])
            shapes[i.name], dtypes[i.name] = b.shape, b.dtype
        else:
            shapes[i.name], dtypes[i.name] = i.shape, i.dtype  # inline or [regions] in shared memory
    for o in plan.outputs:
        if o.buffer is not None and o.buffer in store and not o.overwrite:
            raise conflict(f"buffer '{o.buffer}' exists; set parameters.overwrite=true on output '{o.name}' "
                           "to replace it", o.loc + ["parameters", "buffer"])
    return shapes, dtypes


@dataclass
class RunOutcome:
    host: dict  # output name -> host array, for outputs returned inline
    shapes: dict  # output name -> concrete shape
    params: dict  # the response's parameters: fusion_id, timings_us, cache hits and misses


class Job:
    """One admitted run between the event loop and a run worker (server/worker.py)."""

    __slots__ = ("plan", "future", "pins", "reserved", "bound", "sizes", "device_inputs", "t_admit", "t_queued",
                 "t_start", "t_end", "batch_size", "result", "stored", "host", "error", "plan_us", "plan_missed")

    def __init__(self, plan: RunPlan, future, t_admit: float):
        self.plan, self.future, self.t_admit = plan, future, t_admit
        self.pins = None
        self.reserved = 0
        self.plan_us, self.plan_missed = 0.0, False  # planned before it was queued (run_limits.ensure_plan)
        self.error: BaseException | None = None
        self.result = self.stored = self.host = None


async def run(rt: Runtime, plan: RunPlan) -> RunOutcome:
    """Admit, pin, check, queue for a run worker; outputs are bound to buffer names only when the
    whole run succeeded. The job releases its pins itself once finished (`finish_batch`), so a
    client that goes away cannot release them while a worker still uses the buffers."""
    t_admit = time.perf_counter()
    executor, store = rt.executor, rt.store
    try:
        executor.admit()  # 429 when the queue is full
    except ApiError:
        rt.metrics.runs_error.inc()  # a refused run is a failed run (docs/operations.md)
        raise
    job = Job(plan, asyncio.get_running_loop().create_future(), t_admit)
    try:
        job.pins = store.try_pin(plan.reads, plan.writes) or await store.acquire(plan.reads, plan.writes)
        await _prepare(rt, job)
        run_limits.check_memory(rt, job, await run_limits.ensure_plan(rt, job))
    except BaseException:
        _release(rt, job)
        rt.metrics.runs_error.inc()
        rt.stats.record_fail(plan.fusion, t_admit)
        raise
    if _runs_inline(rt, job):
        executor.stage(job)
    else:
        executor.workers.submit([job])
    return await job.future


INLINE_INPUT_BYTES = 1 << 20  # a run inline on the loop reads at most this much (its kernels are short)


def _runs_inline(rt: Runtime, job: Job) -> bool:
    plan = job.plan
    if any(i.host is not None or i.region is not None for i in plan.inputs) or plan.alias_buffers or \
            any(o.region is not None for o in plan.outputs):
        return False  # uploads, in-place updates and shared-memory regions go to a worker
    inputs = job.device_inputs
    if sum(a.nbytes for a in inputs.values()) > INLINE_INPUT_BYTES:
        return False
    is_warm = getattr(rt.engine, "is_warm", None)
    return is_warm is not None and is_warm(plan.fusion, inputs)


async def _prepare(rt: Runtime, job: Job) -> None:
    """With the pins held: check the buffers, bind shapes (BindError -> 422 before any work),
    check sizes, reserve the stored outputs' bytes."""
    plan, store = job.plan, rt.store
    shapes, dtypes = _check_pinned(rt, plan)
    bound = _bind(rt, plan.fusion, shapes, dtypes)
    if bound is None:
        bound = await _bind_elsewhere(rt, plan.fusion, shapes, dtypes)
    job.bound = bound
    _check_tensor_sizes(rt, bound)
    sizes = job.sizes = {}
    for o in plan.outputs:
        if o.buffer is not None:
            t = bound.types[o.name]
            sizes[o.buffer] = nbytes_of(tuple(t.shape), t.dtype)
    if sizes:
        loc_of = {o.buffer: o.loc + ["parameters", "buffer"] for o in plan.outputs if o.buffer}
        job.reserved = store.reserve_bytes(sizes, lambda b: loc_of.get(b, []))
    job.device_inputs = {i.name: store.get(i.buffer).array for i in plan.inputs if i.buffer is not None}


_BOUND: dict = {}  # (fusion id, input names, shapes and dtypes) -> Bound: a request's sizes repeat
_BOUND_MAX = 4096


BIND_HERE_OPS = 256  # a graph of more ops binds new sizes on the planning threads, not the event loop


def _bind(rt: Runtime, fusion: Fusion, shapes: dict, dtypes: dict):
    """fusion.bind, remembered per input signature (BindError -> 422 before any work); None for new
    sizes of a large graph (tens of milliseconds of inference: `_bind_elsewhere`)."""
    key = (fusion.id, *((k, shapes[k], dtypes[k]) for k in shapes))
    bound = _BOUND.get(key)
    if bound is None:
        if len(fusion.nodes) > BIND_HERE_OPS:
            return None
        bound = fusion.bind(shapes, dtypes)
        _remember(key, bound)
    return bound


async def _bind_elsewhere(rt: Runtime, fusion: Fusion, shapes: dict, dtypes: dict):
    bound = await rt.planning.call(fusion.bind, shapes, dtypes)
    _remember((fusion.id, *((k, shapes[k], dtypes[k]) for k in shapes)), bound)
    return bound


def _remember(key, bound) -> None:
    if len(_BOUND) >= _BOUND_MAX:
        _BOUND.clear()
    _BOUND[key] = bound


def _check_tensor_sizes(rt: Runtime, bound) -> None:
    """413 before running when any tensor of the run (intermediates too) would exceed the per-buffer
    limit: a tiny request must not make the server allocate without bound."""
    limit = rt.settings.max_buffer_bytes
    for name, t in bound.types.items():
        n = nbytes_of(tuple(t.shape), t.dtype)
        if n > limit:
            raise too_large(f"tensor '{name}' would hold {n} bytes ({t.dtype}{list(t.shape)}), over the limit "
                            f"of {limit} bytes per tensor", ["graph", name])


def _release(rt: Runtime, job: Job) -> None:
    store = rt.store
    if job.reserved:
        store.unreserve(job.reserved)
        job.reserved = 0
    if job.pins is not None:
        store.release(job.pins)
        job.pins = None
    rt.executor.release()


def execute_batch(rt: Runtime, jobs: list[Job]) -> None:
    """On a run worker thread, with every job's pins held: launch the runs back to back, wait for
    the device once, and leave each job its outputs or its own error."""
    with ExitStack() as held:  # [regions] each run's shared-memory regions, pinned until the batch ends
        _execute_pinned(rt, jobs, held)


def _execute_pinned(rt: Runtime, jobs: list[Job], held: ExitStack) -> None:
    arrays = rt.arrays
    t_start = time.perf_counter()
    calls, live = [], []
    for job in jobs:
        job.t_start = t_start
        try:
            check_started_in_time(job.plan.deadline)  # 429 when the run starts after parameters.timeout
            # [regions] pinned, checked again, read (server/region_io.py)
            regions = held.enter_context(region_io.pinned(rt, job.plan, job.device_inputs))
            calls.append((job.plan.fusion, {**_inputs(arrays, job), **regions.inputs}))
            live.append((job, regions))
        except BaseException as e:
            job.error = _device_failure(arrays, e)
    def queue_copies(i: int, res) -> None:  # inside the batch: result copies share its one wait
        job = live[i][0]
        job.host = {o.name: h for o in job.plan.outputs if o.inline
                    and (h := arrays.to_host_queued(res.outputs[o.name])) is not None}

    results = rt.engine.run_batch(calls, on_launched=queue_copies) if calls else []
    for (job, regions), (_fusion, inputs), res in zip(live, calls, results):
        if isinstance(res, BaseException):
            job.error = _device_failure(arrays, res)
            continue
        try:
            job.result = res
            job.stored, job.host = _outputs(arrays, job.plan, res, list(inputs.values()), job.host or {})
            regions.commit(res.outputs)  # [regions] only now do outputs land in their regions
        except BaseException as e:
            job.error = _device_failure(arrays, e)
    try:
        if any(job.stored for job in jobs):
            arrays.synchronize()  # copies of stored outputs (the runs' own work ended with the batch)
    except BaseException as e:  # the device failed under the batch: no run of it may commit
        for job in jobs:
            job.error = job.error or _device_failure(arrays, e)
    t_end = time.perf_counter()
    for job in jobs:
        job.t_end, job.batch_size = t_end, len(jobs)


def _inputs(arrays, job: Job) -> dict:
    plan = job.plan
    inputs = dict(job.device_inputs)
    for i in plan.inputs:
        if i.host is not None:
            inputs[i.name] = arrays.from_host(i.host)
        elif i.name not in plan.alias_buffers and i.buffer in plan.alias_buffers.values():
            # This input reads the buffer another input updates in place: give it the old contents.
            inputs[i.name] = arrays.copy(inputs[i.name])
    return inputs


def _outputs(arrays, plan: RunPlan, result, taken: list, copied: dict) -> tuple[dict, dict]:
    """(stored outputs, host copies of inline ones): `copied` are those already copied in the batch."""
    stored, host = {}, dict(copied)
    for o in plan.outputs:
        a = result.outputs[o.name]
        if o.buffer is not None:
            # A stored buffer owns its memory: never a view of an input, another buffer or output.
            if any(arrays.may_share(a, b) for b in taken) or not arrays.owns(a):
                a = arrays.copy(a)
            a = arrays.contiguous(a)
            stored[o.name] = a
            taken.append(a)
        if o.inline and o.name not in host:
            host[o.name] = arrays.to_host(result.outputs[o.name])
    return stored, host


def _device_failure(arrays, e: BaseException) -> BaseException:
    if isinstance(e, MemoryError):  # NumPy's and CuPy's out-of-memory errors both derive from it
        return too_large(f"the run ran out of memory on {arrays.device}: {e}")
    return e


def finish_batch(rt: Runtime, jobs: list[Job]) -> None:
    """On the event loop, for a batch a worker finished: commit each successful run's stored
    outputs (all of a run's at once: nothing else runs on the loop in between), release its pins
    and answer its request."""
    store, metrics = rt.store, rt.metrics
    metrics.run_batch_size.observe(len(jobs))
    for job in jobs:
        try:
            if job.error is None:
                bound = job.bound
                for o in job.plan.outputs:
                    if o.buffer is not None:
                        t = bound.types[o.name]
                        store.commit(o.buffer, job.stored[o.name], t.dtype, tuple(t.shape), job.sizes[o.buffer])
                outcome = _outcome(rt, job)
        except BaseException as e:
            job.error = e
        finally:
            _release(rt, job)
        metrics.run_queue_seconds.observe(job.t_start - job.t_queued)
        fut = job.future
        if fut.cancelled():
            continue
        if job.error is None:
            rt.stats.record_ok(job.plan.fusion, outcome)
            fut.set_result(outcome)
        else:
            metrics.runs_error.inc()
            rt.stats.record_fail(job.plan.fusion, job.t_admit)
            fut.set_exception(job.error)


def _outcome(rt: Runtime, job: Job) -> RunOutcome:
    result, plan = job.result, job.plan
    t_end = time.perf_counter()
    raw = dict(result.timings_us or {})
    # The CuPy backend reports how many kernels it compiled next to its timings.
    compiled = int(raw.pop("kernel_cache_misses", 0) or 0)
    timings = {k: float(v) for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    hits, misses = int(result.cache_hits), int(result.cache_misses)
    if job.plan_missed and hits:  # planned before it was queued: the engine found that plan
        hits, misses = hits - 1, misses + 1
    if job.plan_us:
        timings["plan"] = timings.get("plan", 0.0) + job.plan_us
    if not compiled and not misses:
        # A warm run compiled nothing; the CuPy runner repeats the compile time of the cached
        # preparation on every run, which would inflate the metrics and mislead the caller.
        timings["compile"] = 0.0
    # planning before the queue is in "plan" (compute_input), not in the queue's wait as well
    timings["queue"] = max(0.0, (job.t_start - job.t_admit) * 1e6 - job.plan_us)
    timings["batch"] = (job.t_end - job.t_start) * 1e6
    timings["total"] = (t_end - job.t_admit) * 1e6
    rt.metrics.observe_run(t_end - job.t_admit, hits, misses, compiled, timings.get("compile", 0.0))
    params = {"fusion_id": plan.fusion.id, "timings_us": timings, "cache_hits": hits,
              "cache_misses": misses, "kernels_compiled": compiled,
              "batch_size": job.batch_size}
    bound = job.bound
    shapes = {o.name: [int(d) for d in bound.types[o.name].shape] for o in plan.outputs}
    return RunOutcome(job.host, shapes, params)


