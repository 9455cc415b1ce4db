"""The records one infer/execute run passes along its stages, each built once and never changed:

parse (server/run_request.py) -> `ParsedRun` of `RunInput`s and `RunOutput`s
admit (server/runs.py: pins, bound sizes, reserved bytes, plan) -> `AdmittedRun`
launch (server/launch.py, on a run worker or the event loop) -> one `Launched` per run, `BatchTimes`
commit (server/runs.py, on the event loop) -> `RunOutcome`
respond (server/run_request.py) -> the response body.

A stage returns a new record instead of setting fields on a shared one; the only object two
threads share is each admitted run's asyncio future, answered on the event loop.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Mapping

    import numpy as np
    from segfuse.compiler import Fusion
    from segfuse.compiler.dtypes import DType
    from segfuse.compiler.ir import Bound

    from .region_io import RegionSlice

NO_ALIASES: Mapping[str, str] = MappingProxyType({})

# A NamedTuple's own __new__ is a Python function (about 0.3 us a call): the stages build the
# records of every run with `make(Record, (every field, in order))` instead.
make = tuple.__new__


class RunInput(NamedTuple):
    """One of a request's inputs: a stored buffer, inline data decoded to the host, or a
    shared-memory region (server/region_io.py)."""

    name: str
    loc: tuple  # where in the request: ("inputs", i)
    buffer: str | None = None
    host: np.ndarray | None = None  # decoded inline data
    dtype: DType | None = None  # declared (buffers) or decoded (inline)
    shape: tuple | None = None
    region: RegionSlice | None = None  # [regions] read from shared memory


class RunOutput(NamedTuple):
    """One output the response mentions: stored as a buffer, returned (inline, JSON or binary),
    or written to a shared-memory region."""

    name: str
    loc: tuple  # ("outputs", k)
    buffer: str | None = None
    overwrite: bool = False
    inline: bool = True
    binary: bool = False
    alias_of: str | None = None  # graph input this output updates in place
    region: RegionSlice | None = None  # [regions] written to shared memory


class ParsedRun(NamedTuple):
    """An infer request checked against its fusion (`run_request.parse_request`). Holds no state:
    a repeated body reuses it (server/parsed_requests.py)."""

    fusion: Fusion
    inputs: tuple[RunInput, ...]
    outputs: tuple[RunOutput, ...]  # the outputs the response mentions
    alias_buffers: Mapping[str, str]  # graph input -> buffer updated in place
    reads: frozenset[str]  # buffers the run reads (pinned shared)...
    writes: frozenset[str]  # ...and writes (pinned exclusive)
    deadline: float | None  # parameters.timeout: perf_counter time by which the run must start


class AdmittedRun(NamedTuple):
    """A run counted in, its buffers pinned and checked, sizes bound, stored outputs' bytes
    reserved, its plan made: ready to launch. `pins` and `reserved` are given back once, when
    the run is answered (`runs.finish_batch`) or refused before it was queued."""

    parsed: ParsedRun
    future: asyncio.Future  # answered on the event loop: the outcome or the run's error
    pins: tuple[frozenset, frozenset]
    reserved: int  # bytes reserved for stored outputs
    bound: Bound
    sizes: dict[str, int]  # stored output's buffer -> bytes
    device_inputs: dict[str, Any]  # input name -> the stored buffer's array
    t_admit: float
    t_queued: float
    plan_us: float  # planned before it was queued (run_limits.ensure_plan)...
    plan_missed: bool  # ...and not found in the plan cache


class Launched(NamedTuple):
    """What the launch left for one run: its engine result, outputs to store and host copies of
    outputs returned inline, or its error."""

    result: Any = None  # compiler RunResult
    stored: dict | None = None  # output name -> array to commit as a buffer
    host: dict | None = None  # output name -> host array for the response
    error: BaseException | None = None


class BatchTimes(NamedTuple):
    """When a batch of runs started and ended (perf_counter), and how many runs it held."""

    start: float
    end: float
    size: int


class RunOutcome(NamedTuple):
    host: dict  # output name -> host array, for outputs returned inline
    shapes: dict  # output name -> concrete shape
    params: dict  # the response's parameters: fusion_id, timings_us, cache hits and misses
