"""Run a `Plan` on the CPU, segment by segment, with the plan's real buffer aliasing.

This is the NumPy twin of the GPU runtime, built to make alias bugs visible on a laptop:
- every plan `Buffer` is one NumPy byte array; the tensors assigned to it are views into it, so
  a buffer reused by a later tensor really is overwritten, and freed buffers are poisoned;
- a scatter writes its result into the very array of its `self` buffer (in place), so a plan that
  lets anything read `self` afterwards produces wrong results here, as it would on the GPU;
- private copies are real copies; pure views are NumPy views of their base's array;
- graph inputs are read-only views, except inputs that an output declares `alias_of`, which the
  caller (`Engine`) stages as private arrays and commits only after the whole run succeeded;
- a segment sees only its own inputs and what it makes: reading anything else is a plan bug.
"""

from __future__ import annotations

import math

import numpy as np

from .commit import commit
from .errors import Issue, OpError, RunError
from .ir import Fusion
from .plan import Plan

POISON = 0xA5  # freed buffers are filled with this byte so reads after free show up


class PlanBug(AssertionError):
    """The plan is inconsistent (a read of a tensor no segment provides, an alias that is not real)."""


def _as_tensor(buf: np.ndarray, t) -> np.ndarray:
    return buf[:_nbytes(t)].view(t.dtype.np).reshape(t.shape)


def execute(plan: Plan, fusion: Fusion, types: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run the plan; `types` are the concrete types (Fusion.bind), `inputs` the arrays to read
    (write-protect them unless they are staged copies). Returns every graph output's array."""
    return _Executor(plan, fusion, types, inputs).run()


class _Executor:
    def __init__(self, plan: Plan, fusion: Fusion, types: dict, inputs: dict[str, np.ndarray]):
        self.plan, self.fusion, self.inputs = plan, fusion, inputs
        self.types = dict(types)
        for s in plan.segments:
            for c in s.copies:
                self.types[c.dst] = self.types[c.src]
        # One byte array per buffer, sized for the largest tensor it holds at these sizes.
        self.arrays: dict[int, np.ndarray] = {}
        for b in plan.buffers:
            if b.kind != "input":
                size = max(_nbytes(self.types[t]) for t in b.tensors)
                self.arrays[b.id] = np.full(max(size, 1), POISON, dtype=np.uint8)
        self.glob: dict[str, np.ndarray] = dict(inputs)  # materialised tensors, visible to every segment
        self.seg = None
        self.local: dict[str, np.ndarray] = {}  # what the current segment made

    def run(self) -> dict[str, np.ndarray]:
        for seg in self.plan.segments:
            self.run_segment(seg)
        missing = [o for o in self.plan.outputs if o not in self.glob]
        if missing:
            raise PlanBug(f"no segment provides the graph outputs {missing}")
        return {o: self.glob[o] for o in self.plan.outputs}

    def run_segment(self, seg) -> None:
        self.seg, self.local = seg, {}
        aliased = {a.tensor: a.buffer for a in seg.aliases}
        for i, pos in enumerate(seg.nodes):
            self.run_copies(i)
            node = self.fusion.nodes[pos]
            operands = list(node.inputs)
            if node.outputs[0] in aliased:
                operands[0] = aliased[node.outputs[0]]  # the private copy, or self itself
            args = [self.get(x) if isinstance(x, str) else x.value for x in operands]
            try:
                outs = node.op.ref(args, node.attrs, [self.types[n] for n in node.outputs])
            except OpError as e:
                raise RunError([Issue(("ops", node.index) + e.where, e.msg)]) from None
            for name, arr in zip(node.outputs, outs):
                self.put(name, np.asarray(arr), in_place_of=aliased.get(name))
        self.run_copies(len(seg.nodes))
        for t in seg.outputs:
            self.glob[t] = self.local[t]
        self.free(self.plan.frees.get(str(seg.id), []))

    def run_copies(self, at: int) -> None:
        for c in self.seg.copies:
            if c.at == at:
                self.put(c.dst, np.array(self.get(c.src), copy=True))

    def free(self, tensors: list[str]) -> None:
        """Drop dead tensors and poison their buffers, so a read after free shows."""
        for t in tensors:
            self.glob.pop(t, None)
        for bid in {self.plan.tensor_buffer[t] for t in tensors if t in self.plan.tensor_buffer}:
            if not any(self.plan.tensor_buffer.get(t) == bid for t in self.glob):
                self.arrays[bid].fill(POISON)

    def storage_of(self, t: str) -> np.ndarray | None:
        """t's place in its plan buffer (None: a register/shared-memory tensor)."""
        bid = self.plan.tensor_buffer.get(t)
        if bid is None:
            return None
        if bid not in self.arrays:  # an input buffer: the input array itself
            owner = next(x for x in self.plan.buffers[bid].tensors if x in self.inputs)
            return self.inputs[owner]
        return _as_tensor(self.arrays[bid], self.types[t])

    def get(self, t: str) -> np.ndarray:
        if t in self.local:
            return self.local[t]
        if t in self.glob and t in self.seg.inputs:
            return self.glob[t]
        raise PlanBug(f"segment {self.seg.id} reads '{t}', which is neither its input nor made in it")

    def put(self, t: str, value: np.ndarray, *, in_place_of: str | None = None) -> None:
        """Store t where the plan says: its buffer, its base's buffer (a view), or self's (a scatter)."""
        dest = self.storage_of(t)
        if t in self.plan.views:
            b = self.plan.views[t]
            base = self.local.get(b, self.glob.get(b))
            if base is None or (value.size and not np.shares_memory(value, base)):
                raise PlanBug(f"'{t}' is planned as a view of '{b}' but is not one")
            dest = value
        elif dest is None and in_place_of is not None:
            dest = self.get(in_place_of)  # an in-place scatter on a register/shared-memory tensor
        if dest is None:
            dest = value
        elif dest is not value:
            if in_place_of is not None and dest.size and not np.shares_memory(dest, self.get(in_place_of)):
                raise PlanBug(f"scatter '{t}' is planned in place of '{in_place_of}' but their buffers differ")
            np.copyto(dest, value, casting="no")
        self.local[t] = dest


def _nbytes(t) -> int:
    return math.prod(t.shape) * t.dtype.itemsize  # (np.prod costs microseconds a call; shapes are ints)


def run_plan(plan: Plan, fusion: Fusion, bound_types: dict, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute with the Engine's guarantees: inputs are never written, except `alias_of` targets,
    which are updated only after every segment succeeded. Returns the outputs, committed by the
    plan's `Commit`s (compiler/commit.py), each C-contiguous and writeable."""
    aliased = {o.alias_of for o in fusion.outputs if o.alias_of is not None}
    staged = {}
    for name, a in inputs.items():
        if name in aliased:
            staged[name] = np.array(a, copy=True)  # the plan may write it in place; commit at the end
        else:
            v = a.view()
            v.flags.writeable = False  # a plan that writes an input fails loudly here
            staged[name] = v
    outs = execute(plan, fusion, bound_types, staged)
    values = dict(staged)
    values.update(outs)

    def write(c, v):
        dst = inputs[c.alias_of]
        if not dst.flags.writeable:
            raise RunError(f"input '{c.alias_of}' is read-only but output '{c.name}' updates it in place",
                           ("inputs", c.alias_of))
        np.copyto(dst, v)
        return dst

    commits = plan.output_commits(fusion)
    res = commit(commits, values, lambda v: np.array(v, copy=True), write)
    # C-contiguous and writeable (np.require keeps 0-d; a no-op for the plan's own buffers)
    return {name: np.require(v, requirements=["C", "W"]) for name, v in res.items()}
