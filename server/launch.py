"""Launching a batch of admitted runs (server/run_records.py AdmittedRun), on a run worker thread
(server/worker.py) or, for warm runs on small inputs, on the event loop: the runs are launched back
to back, the device is waited for once, and each run gets a `Launched` record, its outputs or its
own error. Nothing is committed here: the event loop does that (server/runs.py commit_batch)."""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import TYPE_CHECKING

from . import region_io
from .errors import too_large
from .protocol import check_started_in_time
from .run_records import AdmittedRun, BatchTimes, Launched, ParsedRun, make

if TYPE_CHECKING:
    from .state import ServerState


def launch_batch(state: ServerState, runs: list[AdmittedRun]) -> tuple[list[Launched], BatchTimes]:
    """With every run's pins held: (one `Launched` per run, in order, and the batch's times)."""
    with ExitStack() as held:  # [regions] each run's shared-memory regions, pinned until the batch ends
        return _launch_pinned(state, runs, held)


def _launch_pinned(state: ServerState, runs: list[AdmittedRun], held: ExitStack):
    arrays = state.arrays
    t_start = time.perf_counter()
    launched: list = [None] * len(runs)
    calls, live = [], []  # the engine's (fusion, inputs) per run that starts; (index in runs, regions)
    for k, run in enumerate(runs):
        try:
            check_started_in_time(run.parsed.deadline)  # 429 when the run starts after parameters.timeout
            # [regions] pinned, checked again, read (server/region_io.py)
            regions = held.enter_context(region_io.pinned(state, run.parsed, run.device_inputs))
            calls.append((run.parsed.fusion, {**_inputs(arrays, run), **regions.inputs}))
            live.append((k, regions))
        except BaseException as e:
            launched[k] = Launched(error=_device_failure(arrays, e))
    copied: list = [None] * len(calls)  # host copies of inline outputs queued inside the batch

    def queue_copies(i: int, res) -> None:  # inside the batch: result copies share its one wait
        copied[i] = {o.name: h for o in runs[live[i][0]].parsed.outputs if o.inline
                     and (h := arrays.to_host_queued(res.outputs[o.name])) is not None}

    results = state.engine.run_batch(calls, on_launched=queue_copies) if calls else []
    for i, ((k, regions), (_fusion, inputs), res) in enumerate(zip(live, calls, results)):
        if isinstance(res, BaseException):
            launched[k] = Launched(error=_device_failure(arrays, res))
            continue
        try:
            stored, host = _outputs(arrays, runs[k].parsed, res, list(inputs.values()), copied[i] or {})
            regions.commit(res.outputs)  # [regions] only now do outputs land in their regions
            launched[k] = make(Launched, (res, stored, host, None))
        except BaseException as e:
            launched[k] = Launched(error=_device_failure(arrays, e))
    try:
        if any(out.stored for out in launched):
            arrays.synchronize()  # copies of stored outputs (the runs' own work ended with the batch)
    except BaseException as e:  # the device failed under the batch: no run of it may commit
        launched = [out if out.error is not None else Launched(error=_device_failure(arrays, e))
                    for out in launched]
    return launched, make(BatchTimes, (t_start, time.perf_counter(), len(runs)))


def _inputs(arrays, run: AdmittedRun) -> dict:
    parsed = run.parsed
    inputs = dict(run.device_inputs)
    for i in parsed.inputs:
        if i.host is not None:
            inputs[i.name] = arrays.from_host(i.host)
        elif i.name not in parsed.alias_buffers and i.buffer in parsed.alias_buffers.values():
            # This input reads the buffer another input updates in place: give it the old contents.
            inputs[i.name] = arrays.copy(inputs[i.name])
    return inputs


def _outputs(arrays, parsed: ParsedRun, result, taken: list, copied: dict) -> tuple[dict, dict]:
    """(stored outputs, host copies of inline ones): `copied` are those already copied in the batch."""
    stored, host = {}, dict(copied)
    for o in parsed.outputs:
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
