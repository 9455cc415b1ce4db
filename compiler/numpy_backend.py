"""The CPU backend: executes a fusion with each op's NumPy reference implementation.

`NumpyBackend` runs a plan segment by segment with its real buffer aliasing (compiler/plan_executor.py).
`run_graph` interprets the graph op by op (the oracle the segmented backends are compared
with). Inputs are never written, except that outputs declared `alias_of` an input are copied
into that input's array once the whole run has succeeded.
"""

from __future__ import annotations

import numpy as np

from .backend import Backend
from .dtypes import from_numpy
from .errors import BindError, Issue, OpError, RunError
from .ir import Fusion
from .ops.registry import Scalar
from .plan_executor import run_plan


def input_types(inputs: dict[str, np.ndarray], loc_prefix=("inputs",)):
    shapes, dtypes, issues = {}, {}, []
    for name, a in inputs.items():
        a = np.asarray(a)
        shapes[name] = a.shape
        try:
            dtypes[name] = from_numpy(a.dtype)
        except ValueError as e:
            issues.append(Issue(loc_prefix + (name,), str(e)))
    if issues:
        raise BindError(issues)
    return shapes, dtypes


def eval_node(node, values: dict, types: dict) -> None:
    """Run one node's reference implementation, storing its results in `values`."""
    args = [values[x] if isinstance(x, str) else x.value for x in node.inputs]
    out_types = [types[n] for n in node.outputs]
    try:
        outs = node.op.ref(args, node.attrs, out_types)
    except OpError as e:
        raise RunError([Issue(("ops", node.index) + e.where, e.msg)]) from None
    for name, arr, t in zip(node.outputs, outs, out_types):
        arr = np.asarray(arr)
        if arr.dtype != t.dtype.np or arr.shape != tuple(t.shape):
            raise AssertionError(f"{node.label()}: reference produced {arr.dtype}{list(arr.shape)}, expected {t}")
        values[name] = arr


def run_graph(fusion: Fusion, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute op by op. Returns the outputs; commits `alias_of` outputs into their inputs."""
    inputs = {k: np.asarray(v) for k, v in inputs.items()}
    shapes, dtypes = input_types(inputs)
    bound = fusion.bind(shapes, dtypes)
    values = dict(inputs)
    for node in fusion.nodes:
        eval_node(node, values, bound.types)
    return commit_outputs(fusion, values, inputs)


def commit_outputs(fusion: Fusion, values: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    result = {}
    # Values that view an input are copied before any alias is committed: committing first would
    # change them (an output reshape(x) must keep x's old value when another output updates x).
    values = {o.name: (values[o.name].copy() if any(np.shares_memory(values[o.name], a)
                                                    for a in inputs.values()) else values[o.name])
              for o in fusion.outputs}
    for o in fusion.outputs:
        v = values[o.name]
        if o.alias_of is not None:
            dst = inputs[o.alias_of]
            if not dst.flags.writeable:
                raise RunError(f"input '{o.alias_of}' is read-only but output '{o.name}' updates it in place",
                               ("inputs", o.alias_of))
            np.copyto(dst, v)
            result[o.name] = dst
        elif any(np.shares_memory(v, a) for a in inputs.values()):
            result[o.name] = v.copy()  # an output never exposes an input's buffer
        else:
            # C-contiguous and writeable (a view such as expand's broadcast is read-only); keeps 0-d
            result[o.name] = np.require(v, requirements=["C", "W"])
    return result


class NumpyBackend(Backend):
    """Plans executed on the host: synchronous, nothing to compile, no fast path."""

    name = "numpy"

    def read_inputs(self, fusion, inputs: dict) -> tuple[dict, dict, dict]:
        inputs = {k: np.asarray(v) for k, v in inputs.items()}
        shapes, dtypes = input_types(inputs)
        return shapes, dtypes, inputs

    def run(self, plan, fusion, bound, inputs: dict, deferred: bool = False) -> tuple[dict, dict]:
        return run_plan(plan, fusion, bound.types, inputs), {}


_ = Scalar
