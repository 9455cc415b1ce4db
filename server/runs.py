"""Running a fusion for an infer/execute request: the stages on the event loop.

Order of work, each step able to fail without side effects:
parse and decode the request (server/run_request.py) -> admit into the run queue (429) -> pin
buffers (waits for conflicting DELETEs/overwrites/runs) -> check buffers, bind shapes, reserve
output bytes -> plan a cold run on the planning threads under the work budget, check the memory
it needs (server/run_limits.py; 413) -> launch in a batch (server/launch.py: on the event loop for
warm runs on small inputs, else on a run worker) -> only then commit outputs to buffer names and
answer (`commit_batch`). Each stage hands the next a record (server/run_records.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from segfuse.compiler import Fusion

from . import run_limits
from .errors import ApiError, bad_request, conflict, not_found, too_large
from .run_records import AdmittedRun, BatchTimes, Launched, ParsedRun, RunOutcome, make
from .stats import failure_reason
from .tensors import kserve_name, nbytes_of

if TYPE_CHECKING:
    from .state import ServerState


async def run(state: ServerState, parsed: ParsedRun) -> RunOutcome:
    """Admit, pin, check, queue for a run worker; outputs are bound to buffer names only when the
    whole run succeeded. The run's pins are given back when it is answered (`commit_batch`), so a
    client that goes away cannot release them while a worker still uses the buffers."""
    t_admit = time.perf_counter()
    executor, store = state.executor, state.store
    try:
        executor.admit()  # 429 when the queue is full
    except ApiError as e:
        state.metrics.runs_error.inc()  # a refused run is a failed run (docs/operations.md)...
        state.stats.record_rejected(parsed.fusion, e)  # ...but no run of the fusion (server/stats.py)
        raise
    pins, reserved = None, 0
    try:
        pins = store.try_pin(parsed.reads, parsed.writes) or await store.acquire(parsed.reads, parsed.writes)
        bound, sizes, device_inputs, reserved = await _prepare(state, parsed)
        plan, plan_us, plan_missed = await run_limits.ensure_plan(state, parsed.fusion, bound)
        run_limits.check_memory(state, parsed, bound, plan)
    except BaseException as e:
        _give_back(state, pins, reserved)
        state.metrics.runs_error.inc()
        state.stats.record_rejected(parsed.fusion, e, t_admit)  # refused before it ran, or cancelled
        raise
    admitted = make(AdmittedRun, (parsed, asyncio.get_running_loop().create_future(), pins, reserved, bound,
                                  sizes, device_inputs, t_admit, time.perf_counter(), plan_us, plan_missed))
    if _runs_inline(state, admitted):
        executor.stage(admitted)
    else:
        executor.workers.submit([admitted])
    return await admitted.future


INLINE_INPUT_BYTES = 1 << 20  # a run inline on the loop reads at most this much (its kernels are short)
# On the host backend the run is the computation: inline where handing it to a worker thread and
# back costs more than the run; request data above this size was measured slower inline
INLINE_REQUEST_DATA_BYTES = 1 << 16


def _runs_inline(state: ServerState, run: AdmittedRun) -> bool:
    parsed = run.parsed
    if any(i.region is not None for i in parsed.inputs) or parsed.alias_buffers or \
            any(o.region is not None for o in parsed.outputs):
        return False  # in-place updates and shared-memory regions go to a worker
    inputs = run.device_inputs
    if sum(a.nbytes for a in inputs.values()) > INLINE_INPUT_BYTES:
        return False
    is_warm = getattr(state.engine, "is_warm", None)
    if is_warm is None:
        return False
    if state.arrays.name == "numpy":  # the run is the computation, on small request data
        host = {i.name: i.host for i in parsed.inputs if i.host is not None}
        return sum(a.nbytes for a in host.values()) <= INLINE_REQUEST_DATA_BYTES and \
            is_warm(parsed.fusion, {**inputs, **host}, run.bound)
    if any(i.host is not None for i in parsed.inputs):
        return False  # uploads to the device go to a worker
    return is_warm(parsed.fusion, inputs)


async def _prepare(state: ServerState, parsed: ParsedRun):
    """With the pins held: check the buffers, bind shapes (BindError -> 400 before any work),
    check sizes, reserve the stored outputs' bytes (last: nothing after it fails). Returns
    (bound, stored output's buffer -> bytes, stored inputs' arrays, bytes reserved)."""
    store = state.store
    shapes, dtypes = _check_pinned(state, parsed)
    bound = _bind(state, parsed.fusion, shapes, dtypes)
    if bound is None:
        bound = await _bind_elsewhere(state, parsed.fusion, shapes, dtypes)
    _check_tensor_sizes(state, bound)
    sizes = {}
    for o in parsed.outputs:
        if o.buffer is not None:
            t = bound.types[o.name]
            sizes[o.buffer] = nbytes_of(tuple(t.shape), t.dtype)
    device_inputs = {i.name: store.get(i.buffer).array for i in parsed.inputs if i.buffer is not None}
    reserved = 0
    if sizes:
        loc_of = {o.buffer: [*o.loc, "parameters", "buffer"] for o in parsed.outputs if o.buffer}
        reserved = store.reserve_bytes(sizes, lambda b: loc_of.get(b, []))
    return bound, sizes, device_inputs, reserved


def _check_pinned(state: ServerState, parsed: ParsedRun) -> tuple[dict, dict]:
    """With every pin held: buffers exist and agree with what the request declares, and outputs
    may be stored where asked. Returns the inputs' shapes and dtypes."""
    store = state.store
    shapes, dtypes = {}, {}
    for i in parsed.inputs:
        if i.buffer is not None:
            b = store.get(i.buffer)
            if b is None:
                raise not_found("buffer", i.buffer, (*i.loc, "parameters", "buffer"))
            if i.dtype is not None and i.dtype is not b.dtype:
                raise bad_request(f"input '{i.name}' declares {kserve_name(i.dtype)} but buffer "
                                    f"'{i.buffer}' holds {kserve_name(b.dtype)}", (*i.loc, "datatype"))
            if i.shape is not None and tuple(i.shape) != b.shape:
                raise bad_request(f"input '{i.name}' declares shape {list(i.shape)} but buffer "
                                    f"'{i.buffer}' has shape {list(b.shape)}", (*i.loc, "shape"))
            shapes[i.name], dtypes[i.name] = b.shape, b.dtype
        else:
            shapes[i.name], dtypes[i.name] = i.shape, i.dtype  # inline or [regions] in shared memory
    for o in parsed.outputs:
        if o.buffer is not None and o.buffer in store and not o.overwrite:
            raise conflict(f"buffer '{o.buffer}' exists; set parameters.overwrite=true on output '{o.name}' "
                           "to replace it", (*o.loc, "parameters", "buffer"))
    return shapes, dtypes


BIND_HERE_OPS = 256  # a graph of more ops binds new sizes on the planning threads, not the event loop


def _bind(state: ServerState, fusion: Fusion, shapes: dict, dtypes: dict):
    """fusion.bind (remembered per input signature by the fusion; BindError -> 400 before any
    work); None for new sizes of a large graph (tens of milliseconds of inference:
    `_bind_elsewhere`)."""
    if len(fusion.nodes) <= BIND_HERE_OPS:
        return fusion.bind(shapes, dtypes)  # (its memo first: one lookup on a warm request)
    return fusion.bound_for(shapes, dtypes)


async def _bind_elsewhere(state: ServerState, fusion: Fusion, shapes: dict, dtypes: dict):
    return await state.planning.call(fusion.bind, shapes, dtypes)


def _check_tensor_sizes(state: ServerState, bound) -> None:
    """413 before running when any tensor of the run (intermediates too) would exceed the per-buffer
    limit: a tiny request must not make the server allocate without bound."""
    limit = state.settings.max_buffer_bytes
    for name, t in bound.types.items():
        n = nbytes_of(tuple(t.shape), t.dtype)
        if n > limit:
            raise too_large(f"tensor '{name}' would hold {n} bytes ({t.dtype}{list(t.shape)}), over the limit "
                            f"of {limit} bytes per tensor", ["graph", name])


def _give_back(state: ServerState, pins, reserved: int) -> None:
    """A run's reserved bytes and pins (None: not taken yet), and its place in the run queue."""
    store = state.store
    if reserved:
        store.unreserve(reserved)
    if pins is not None:
        store.release(pins)
    state.executor.release()


def commit_batch(state: ServerState, runs: list[AdmittedRun], done) -> None:
    """On the event loop, for a batch that was launched (`done`: `launch.launch_batch`'s
    (Launched per run, BatchTimes), or the exception it raised): commit each successful run's
    stored outputs (all of a run's at once: nothing else runs on the loop in between), give back
    its pins and answer its request."""
    store, metrics = state.store, state.metrics
    metrics.run_batch_size.observe(len(runs))
    if isinstance(done, BaseException):  # a bug in the launch: the batch fails rather than hangs
        launched, times = [Launched(error=done)] * len(runs), None
    else:
        launched, times = done
    for run, out in zip(runs, launched):
        error = out.error
        try:
            if error is None:
                bound = run.bound
                for o in run.parsed.outputs:
                    if o.buffer is not None:
                        t = bound.types[o.name]
                        store.commit(o.buffer, out.stored[o.name], t.dtype, tuple(t.shape), run.sizes[o.buffer])
                outcome = _outcome(state, run, out, times)
        except BaseException as e:
            error = e
        finally:
            _give_back(state, run.pins, run.reserved)
        if times is not None:
            metrics.run_queue_seconds.observe(times.start - run.t_queued)
        if error is None:  # counted as it ran, answered or not (its client may have gone away)
            state.stats.record_ok(run.parsed.fusion, outcome)
        else:
            metrics.runs_error.inc()
            state.stats.record_fail(run.parsed.fusion, run.t_admit, failure_reason(error))
        fut = run.future
        if fut.cancelled():
            continue
        if error is None:
            fut.set_result(outcome)
        else:
            fut.set_exception(error)


def _outcome(state: ServerState, run: AdmittedRun, out: Launched, times: BatchTimes) -> RunOutcome:
    result, parsed = out.result, run.parsed
    t_end = time.perf_counter()
    raw = dict(result.timings_us or {})
    # The CuPy backend reports how many kernels it compiled next to its timings.
    compiled = int(raw.pop("kernel_cache_misses", 0) or 0)
    timings = {k: float(v) for k, v in raw.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    hits, misses = int(result.cache_hits), int(result.cache_misses)
    if run.plan_missed and hits:  # planned before it was queued: the engine found that plan
        hits, misses = hits - 1, misses + 1
    if run.plan_us:
        timings["plan"] = timings.get("plan", 0.0) + run.plan_us
    if not compiled and not misses:
        # A warm run compiled nothing; the CuPy runner repeats the compile time of the cached
        # preparation on every run, which would inflate the metrics and mislead the caller.
        timings["compile"] = 0.0
    # planning before the queue is in "plan" (compute_input), not in the queue's wait as well
    timings["queue"] = max(0.0, (times.start - run.t_admit) * 1e6 - run.plan_us)
    timings["batch"] = (times.end - times.start) * 1e6
    timings["total"] = (t_end - run.t_admit) * 1e6
    state.metrics.observe_run(t_end - run.t_admit, hits, misses, compiled, timings.get("compile", 0.0))
    params = {"fusion_id": parsed.fusion.id, "timings_us": timings, "cache_hits": hits,
              "cache_misses": misses, "kernels_compiled": compiled, "batch_size": times.size}
    bound = run.bound
    shapes = {o.name: [int(d) for d in bound.types[o.name].shape] for o in parsed.outputs}
    return make(RunOutcome, (out.host, shapes, params))
