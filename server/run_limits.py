"""What a run may cost before it is queued: its plan, made off the run workers under the work budget
when it is cold (`ensure_plan`), and the memory it needs, refused with 413 past `max_run_bytes` or,
on a GPU, past the device's free memory (`check_memory`), both before anything is allocated."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
from segfuse.compiler.plan import bytes_needed

from .errors import too_large
from .tensors import nbytes_of

if TYPE_CHECKING:
    from segfuse.compiler import Fusion
    from segfuse.compiler.ir import Bound

    from .run_records import ParsedRun
    from .state import ServerState

# Characters orjson may write for one element of an output returned as JSON, comma included: a
# float's shortest round-trip form (float16 and bfloat16 are widened to float32), an integer's
# longest decimal form, `false`.
_FLOAT_JSON_BYTES = {2: 16, 4: 16, 8: 25}
# On a GPU, a run that needs more device memory than this is also checked against the free memory
# (a driver call; smaller runs that do not fit fail with the device's own out-of-memory, also 413).
CHECK_FREE_BYTES = 256 << 20

_NEED: dict = {}  # (fusion id, sizes) -> bytes the plan allocates (bytes_needed); a run's sizes repeat
_NEED_MAX = 4096


_NO_PLAN = (None, 0.0, False)


async def ensure_plan(state: ServerState, fusion: Fusion, bound: Bound) -> tuple:
    """(the run's plan or None when the engine has no plan cache, microseconds spent planning it
    here, whether the plan cache missed). A plan not cached for these sizes is made (or found by
    replaying a class's size tests) on the planning threads, under the work budget (413 past it),
    so that a run worker only ever finds it: a graph slow to plan never holds up other clients' runs."""
    plans = getattr(state.engine, "plans", None)
    cached = getattr(plans, "cached", None)
    if cached is None:
        return _NO_PLAN
    plan = cached(fusion, bound)
    if plan is not None:
        return plan, 0.0, False
    t0 = time.perf_counter()
    plan, hit = await state.planning.call(plans.get, fusion, bound)
    return plan, (time.perf_counter() - t0) * 1e6, not hit


def json_bytes_per_element(dtype) -> int:
    """At most how many bytes one element of this dtype takes in a JSON response."""
    if dtype.is_float:
        return _FLOAT_JSON_BYTES[dtype.itemsize]
    if dtype.is_bool:
        return 6
    info = np.iinfo(dtype.np)
    return max(len(str(info.min)), len(str(info.max))) + 1


def run_need(state: ServerState, parsed: ParsedRun, bound: Bound, plan) -> dict[str, int]:
    """The bytes a run needs, by what needs them: `plan` (its buffers, scratch and, on the NumPy
    backend, the arrays a segment keeps; compiler/plan.py bytes_needed), `inputs` (inline and
    shared-memory inputs moved where the run happens, inputs updated in place copied), and
    `outputs` (host copies of outputs returned in the response, and their JSON text)."""
    fusion = parsed.fusion
    types = bound.types
    need = {"plan": 0, "inputs": 0, "outputs": 0}
    if plan is not None:
        key = (fusion.id, tuple(sorted(bound.env.items())))
        n = _NEED.get(key)
        if n is None:
            n = bytes_needed(plan, types, host_arrays=state.arrays.name == "numpy")
            if len(_NEED) >= _NEED_MAX:
                _NEED.clear()
            _NEED[key] = n
        need["plan"] = n
    for i in parsed.inputs:
        if i.buffer is None or i.name in parsed.alias_buffers:
            t = types[i.name]
            need["inputs"] += nbytes_of(tuple(t.shape), t.dtype)
    for o in parsed.outputs:
        if o.inline:
            t = types[o.name]
            n = nbytes_of(tuple(t.shape), t.dtype)
            need["outputs"] += n
            if not o.binary:
                need["outputs"] += (n // t.dtype.itemsize) * json_bytes_per_element(t.dtype)
    return need


def check_memory(state: ServerState, parsed: ParsedRun, bound: Bound, plan) -> None:
    """413, before anything is allocated, when the run needs more than `max_run_bytes` in all or,
    on a GPU, more device memory than is free."""
    need = run_need(state, parsed, bound, plan)
    total, limit = sum(need.values()), state.settings.max_run_bytes
    parts = ", ".join(f"{v} for {k}" for k, v in need.items() if v)
    if total > limit:
        hint = " (outputs can be stored as buffers or returned as binary data)" if need["outputs"] > limit // 2 else ""
        raise too_large(f"the run needs {total} bytes ({parts}), over the limit of {limit} bytes a run "
                        f"(max_run_bytes){hint}", ["inputs"])
    device = need["plan"] + need["inputs"]
    if device > CHECK_FREE_BYTES:
        free = device_free_bytes(state)
        if free is not None and device > free:
            raise too_large(f"the run needs {device} bytes of memory on {state.arrays.device}, where {free} bytes "
                            "are free", ["inputs"])


def device_free_bytes(state: ServerState) -> int | None:
    """Free device memory, CuPy's pool's unused blocks included; None without a GPU."""
    cp = getattr(state.arrays, "cp", None)
    if cp is None:
        return None
    free, _total = cp.cuda.runtime.memGetInfo()
    return int(free) + int(cp.get_default_memory_pool().free_bytes())
