"""`TorchFusion`: one fusion as a `torch.library` custom op and a callable on torch tensors.

The op is `torch.ops.segfuse.f_<fusion id>` (the id is the graph's content hash), one per distinct
graph. Its schema takes the graph's inputs in order, marks the ones an output is `alias_of` as
mutated, and returns the other outputs. Its implementation runs CPU tensors on the NumPy backend
and CUDA tensors on the CUDA path (torch_ext/cuda_path.py); its fake implementation gives shapes
and dtypes from the compiler's shape rules (torch_ext/fake.py), so `torch.compile(fullgraph=True)`
traces through it.

An eager call (`TorchFusion.__call__` on plain tensors, outside any tracing, mode, transform or
profiler, with no input needing a gradient) skips the dispatcher and runs the implementation
directly, bumping the version counters of the inputs it updates in place as the custom op would;
every other call goes through the op, so dynamo, fake tensors, `opcheck`, autograd and the profiler
see it as before.
"""

from __future__ import annotations

import threading

import torch
from segfuse.compiler.engine import Engine

from .convert import from_numpy, to_numpy
from .fake import output_specs

_LOCK = threading.Lock()
_BY_ID: dict = {}  # fusion id -> TorchFusion (an op is registered once per process)

_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_transforms = torch._C._functorch.peek_interpreter_stack
_profiling = torch._C._autograd._profiler_enabled
_jit_tracing = torch._C._get_tracing_state
_grad_enabled = torch.is_grad_enabled
_bump = torch.autograd.graph.increment_version


def _eager(tensors) -> bool:
    """Whether a call on `tensors` may run the implementation without the dispatcher: nothing
    would see the op (no dynamo, no dispatch or torch-function mode, no functorch transform, no
    JIT tracing, no profiler), the inputs are plain tensors and none needs a gradient (the op
    has no autograd formula, and the dispatcher is what says so)."""
    if _is_compiling() or _dispatch_modes() or _function_modes() or _transforms() is not None \
            or _profiling() or _jit_tracing() is not None:
        return False
    grad = _grad_enabled()
    for t in tensors:
        if type(t) is not _Tensor or (grad and t.requires_grad):
            return False
    return True


def _schema(fusion) -> tuple[str, list[str]]:
    """(schema, mutated argument names): arguments x0.. are the graph's inputs in order."""
    mutated = {o.alias_of for o in fusion.outputs if o.alias_of is not None}
    args, names = [], []
    for i, name in enumerate(fusion.input_names):
        if name in mutated:
            args.append(f"Tensor(a{i}!) x{i}")
            names.append(f"x{i}")
        else:
            args.append(f"Tensor x{i}")
    n = sum(o.alias_of is None for o in fusion.outputs)
    ret = "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"
    return f"({', '.join(args)}) -> {ret}", names


class TorchFusion:
    """A fusion callable on torch tensors (see `segfuse.torch.fusion`)."""

    def __init__(self, fusion):
        self.fusion = fusion
        self.input_names = list(fusion.input_names)
        self.output_names = [o.name for o in fusion.outputs]
        self._alias = {o.name: self.input_names.index(o.alias_of) for o in fusion.outputs if o.alias_of is not None}
        self._returned = [o.name for o in fusion.outputs if o.alias_of is None]
        self._mutated = tuple(sorted(set(self._alias.values())))
        # each output of a call: (True, input position) for alias_of ones, else (False, position
        # among the returned outputs)
        self._assemble = tuple((True, self._alias[n]) if n in self._alias else (False, self._returned.index(n))
                               for n in self.output_names)
        self._fresh_only = not self._alias  # the outputs are the returned ones, in order
        self._n_in = len(self.input_names)
        self._engine = Engine("numpy")
        self._cuda = None
        schema, mutated = _schema(fusion)
        self.qualname = f"segfuse::f_{fusion.id}"
        op = torch.library.custom_op(self.qualname, self._impl, mutates_args=tuple(mutated), schema=schema)
        op.register_fake(self._fake)
        self.op = getattr(torch.ops.segfuse, f"f_{fusion.id}").default

    def __repr__(self) -> str:
        return f"segfuse.torch.fusion({self.fusion.name!r}: {', '.join(self.input_names)} -> {', '.join(self.output_names)})"

    # ---- the op's implementations ---------------------------------------------------------
    def _impl(self, *tensors):
        return _ret(self._run(tensors))

    def _run(self, tensors, keep: bool = False, into: list | None = None) -> list:
        """The returned (not alias_of) outputs of a run on `tensors`, in the graph's order. `keep`:
        a direct eager call (its CUDA memory may be kept for the next one: memory.Kept). `into`:
        per returned output a tensor of the caller's to write it into, or None (CUDA: the kernels
        write each one that fits directly; the rest are copied by `_write_out`)."""
        if tensors and tensors[0].is_cuda:
            cuda = self._cuda
            if cuda is None:
                cuda = self._cuda_runner()
            return cuda.run(tensors, keep, into)  # (it checks the inputs' devices once per signature)
        for t in tensors:
            if not t.is_cpu:
                self._mixed(tensors)
        return self._run_cpu(tensors)

    def _mixed(self, tensors):
        where = ", ".join(f"{n}: {t.device}" for n, t in zip(self.input_names, tensors))
        raise ValueError(f"segfuse.torch: '{self.fusion.name}' needs its inputs on one device, CPU or CUDA ({where})")

    def _run_cpu(self, tensors) -> list:
        res = self._engine.run(self.fusion, {n: to_numpy(t) for n, t in zip(self.input_names, tensors)}).outputs
        return [from_numpy(res[n]) for n in self._returned]  # (alias_of inputs were written in place)

    def _fake(self, *tensors):
        specs = dict(zip(self.output_names, output_specs(self.fusion, tensors)))
        like = tensors[0]
        return _ret([like.new_empty(specs[n][0], dtype=specs[n][1]) for n in self._returned])

    def _cuda_runner(self):
        if self._cuda is None:
            from .cuda_path import CudaRunner  # CuPy only when CUDA tensors come

            with _LOCK:
                if self._cuda is None:
                    self._cuda = CudaRunner(self)
        return self._cuda

    # ---- the callable ----------------------------------------------------------------------
    def _inputs(self, args, kwargs):
        if not kwargs and len(args) == self._n_in:
            for t in args:
                if not isinstance(t, _Tensor):
                    break
            else:
                return args
        if len(args) > len(self.input_names):
            raise TypeError(f"'{self.fusion.name}' takes {len(self.input_names)} inputs "
                            f"({', '.join(self.input_names)}), {len(args)} were given")
        got = dict(zip(self.input_names, args))
        for k, v in kwargs.items():
            if k not in self.input_names:
                raise TypeError(f"inputs.{k}: unknown input (the graph's inputs are: {', '.join(self.input_names)})")
            if k in got:
                raise TypeError(f"inputs.{k}: given twice")
            got[k] = v
        missing = [n for n in self.input_names if n not in got]
        if missing:
            raise TypeError(f"inputs.{missing[0]}: missing input (the graph declares it)")
        for n in self.input_names:
            if not isinstance(got[n], torch.Tensor):
                raise TypeError(f"inputs.{n}: expected a torch.Tensor, got {type(got[n]).__name__}")
        return [got[n] for n in self.input_names]

    def __call__(self, *args, out=None, **kwargs):
        """Run on tensors given in the graph's input order or by name. Returns the outputs in the
        graph's order (one output: the tensor itself); an `alias_of` output is its input, updated
        in place. `out`: tensors to write the results into (a tensor, a sequence in output order
        with None for fresh ones, or a dict by output name); those are returned instead."""
        tensors = self._inputs(args, kwargs)
        if _eager(tensors):
            into = None if out is None else self._out_targets(out)
            fresh = self._run(tensors, True, into)
            for i in self._mutated:
                _bump(tensors[i])
        else:
            res = self.op(*tensors)
            fresh = list(res) if isinstance(res, (tuple, list)) else [] if res is None else [res]
        outs = fresh if self._fresh_only else [tensors[i] if alias else fresh[i] for alias, i in self._assemble]
        if out is not None:
            outs = self._write_out(outs, out)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _out_list(self, out) -> list:
        """`out` as a list in the graph's output order (None: no tensor given)."""
        if isinstance(out, torch.Tensor):
            out = [out]
        if isinstance(out, dict):
            unknown = sorted(set(out) - set(self.output_names))
            if unknown:
                raise TypeError(f"out.{unknown[0]}: unknown output (the graph's outputs are: {', '.join(self.output_names)})")
            out = [out.get(n) for n in self.output_names]
        out = list(out)
        if len(out) != len(self.output_names):
            raise TypeError(f"out: {len(out)} tensors for {len(self.output_names)} outputs")
        return out

    def _out_targets(self, out) -> list:
        """Per returned output the tensor of `out` given for it, or None."""
        given = dict(zip(self.output_names, self._out_list(out)))
        return [t if isinstance(t, _Tensor) and not t.requires_grad else None for t in map(given.get, self._returned)]

    def _write_out(self, outs: list, out) -> list:
        out = self._out_list(out)
        for k, (n, dst) in enumerate(zip(self.output_names, out)):
            if dst is None or n in self._alias:
                continue
            if dst is outs[k]:  # (written by the kernels themselves)
                _bump(dst)
                continue
            if tuple(dst.shape) != tuple(outs[k].shape) or dst.dtype != outs[k].dtype:
                raise TypeError(f"out.{n}: expected {outs[k].dtype}{list(outs[k].shape)}, "
                                f"got {dst.dtype}{list(dst.shape)}")
            dst.copy_(outs[k])
            outs[k] = dst
        return outs

    def warmup(self, *args, **kwargs) -> None:
        """Prepare the CUDA path for inputs like these (same shapes, strides and dtypes) without
        changing them: compiles and loads the kernels, makes the routines they use, and runs the
        op once on copies of the inputs it updates in place, so that a later call can be captured
        in a CUDA graph. Failures of that run (the inputs' contents may be anything) are dropped;
        failures of earlier calls are raised. A no-op for CPU tensors."""
        tensors = self._inputs(args, kwargs)
        if not tensors or tensors[0].device.type != "cuda":
            return
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("segfuse.torch: warmup runs the op, so it cannot be called inside a CUDA graph capture")
        from .cuda_path import cuda

        c = cuda()
        c.report()
        alias = set(self._alias.values())
        copies = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
                  if i in alias else t for i, t in enumerate(tensors)]
        if _eager(copies):
            self._run(copies)
        else:
            self.op(*copies)
        torch.cuda.synchronize()
        c.errors.failures()  # (dropped: see above; blocks of other ops hold none after report())


def _ret(outs: list):
    if not outs:
        return None  # (a schema returning `()`)
    return outs[0] if len(outs) == 1 else tuple(outs)


def register(fusion) -> TorchFusion:
    """The process's TorchFusion of `fusion` (made, and its op registered, at the first call)."""
    with _LOCK:
        hit = _BY_ID.get(fusion.id)
        if hit is None:
            hit = _BY_ID[fusion.id] = TorchFusion(fusion)
        return hit
