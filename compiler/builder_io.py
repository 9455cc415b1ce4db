"""`FusionDefinition.execute([...])`: positional inputs, a list of outputs, torch tensors in and out.

nvFuser's habit: inputs in the order the definition defined them, outputs in the order it added
them. Inputs may be NumPy arrays, torch tensors and Python numbers (for a `define_scalar` input);
the outputs are torch tensors when any input is one (or `device=` names one), NumPy arrays
otherwise.

- CPU tensors run on the NumPy backend (or the one given), read as NumPy views (no copies: an
  input declared `alias_of` is updated in place).
- CUDA tensors run on the Engine's CUDA backend, read as CuPy views (no copies). This is the simple
  path, not the fast one: it waits for the device before and after the run, and the outputs are
  copied into tensors of torch's allocator. `segfuse.torch.fusion(fd)` is the fast path (torch's
  stream and allocator, no waits, CUDA graphs).

torch is optional: it is imported here only when a torch tensor is given or asked for.
"""

from __future__ import annotations

import numpy as np

from .dtypes import DType

# bfloat16 crosses as its 16-bit pattern: NumPy holds it as ml_dtypes.bfloat16, CuPy as uint16
_BF16_BITS = "int16"


def is_torch_tensor(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "device") and hasattr(x, "dtype")


def run_positional(fusion, input_dtypes: list[tuple[str, DType]], values: list, returned: list[str],
                   backend: str | None, device) -> list:
    """Run `fusion` on `values` given in the order of `input_dtypes` ((name, dtype) of each input);
    the outputs named in `returned`, in that order."""
    from .engine import Engine

    if len(values) != len(input_dtypes):
        names = ", ".join(n for n, _ in input_dtypes) or "none"
        raise TypeError(f"execute() takes {len(input_dtypes)} inputs in definition order ({names}), "
                        f"got {len(values)}")
    tensors = [v for v in values if is_torch_tensor(v)]
    torch = _torch() if tensors or device is not None else None
    target = _target_device(torch, tensors, device) if torch is not None else None
    if target is not None and target.type == "cuda":
        if backend not in (None, "cupy"):
            raise ValueError(f"CUDA tensors run on the CUDA backend, not backend={backend!r}")
        return _run_cuda(fusion, input_dtypes, values, returned, torch, target)
    if target is not None and target.type != "cpu":
        raise ValueError(f"segfuse runs on CPU and CUDA devices, not {target}")
    arrays = {n: _host_array(v, dt, torch) for (n, dt), v in zip(input_dtypes, values)}
    outs = Engine.default(backend or "numpy").run(fusion, arrays).outputs
    if torch is None:
        return [outs[n] for n in returned]
    return [_torch_from_host(torch, outs[n], fusion.types[n].dtype).to(target) for n in returned]


def _torch():
    import torch

    return torch


def _target_device(torch, tensors: list, device):
    """Where the outputs go: `device` when given, else the first CUDA tensor's device, else the CPU."""
    if device is not None:
        return torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    for t in tensors:
        if t.device.type != "cpu":
            return t.device
    return torch.device("cpu") if tensors else None


def _host_array(v, dt: DType, torch) -> np.ndarray:
    if torch is not None and is_torch_tensor(v):
        if v.device.type != "cpu":
            raise ValueError(f"an input on {v.device} with the others on the CPU: give them on one device")
        v = v.detach()
        if v.dtype is torch.bfloat16:
            return v.view(getattr(torch, _BF16_BITS)).numpy().view(DType.bfloat16.np)
        return v.numpy()
    if isinstance(v, (bool, int, float)):  # a define_scalar input: a 0-d array of its dtype
        return np.asarray(v, dtype=dt.np)
    return np.asarray(v)


def _torch_from_host(torch, a, dt: DType):
    if hasattr(a, "__cuda_array_interface__"):  # CPU tensors run on a device backend (backend="cupy")
        a = a.get()
    a = np.array(a, copy=True, order="C")  # a fresh tensor: never a view of an input
    if dt is DType.bfloat16:
        return torch.from_numpy(a.view(_BF16_BITS)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _run_cuda(fusion, input_dtypes, values, returned, torch, target) -> list:
    from .engine import Engine, backend_unavailable

    why = backend_unavailable("cupy")
    if why is not None:
        raise RuntimeError(f"CUDA tensors need segfuse's CUDA backend: {why}")
    import cupy as cp

    index = target.index if target.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(index)
    with cp.cuda.Device(index):
        arrays = {n: _device_array(cp, torch, v, dt, index) for (n, dt), v in zip(input_dtypes, values)}
        stream.synchronize()  # the engine's stream does not wait for torch's: the inputs must be ready
        outs = Engine.default("cupy").run(fusion, arrays).outputs  # (it waits for its kernels)
        result = [_torch_from_device(cp, torch, outs[n], fusion.types[n].dtype, target) for n in returned]
        # the copies read memory of CuPy's pool, which a later run may reuse once the arrays are dropped
        stream.synchronize()
    return result


def _device_array(cp, torch, v, dt: DType, index: int):
    if is_torch_tensor(v) and v.device.type == "cuda":
        if v.device.index != index:
            raise ValueError(f"inputs on {v.device} and cuda:{index}: give them on one device")
        v = v.detach()
        if v.dtype is torch.bfloat16:
            return cp.asarray(v.view(getattr(torch, _BF16_BITS))).view(cp.uint16)
        return cp.asarray(v)
    host = _host_array(v, dt, torch)  # CPU scalars (nvFuser's is_cpu inputs), NumPy arrays, numbers
    return cp.asarray(host.view(np.uint16) if dt is DType.bfloat16 else host)


def _torch_from_device(cp, torch, a, dt: DType, target):
    if not hasattr(a, "__cuda_array_interface__"):  # an output the run left on the host
        return _torch_from_host(torch, a, dt).to(target)
    if dt is DType.bfloat16:
        return torch.as_tensor(a.view(cp.int16), device=target).view(torch.bfloat16).clone()
    return torch.as_tensor(a, device=target).clone()
