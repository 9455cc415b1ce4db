"""Runs whose inputs or requested outputs live in shared-memory regions (server/regions.py).

A tensor names a region through its `parameters`, exactly as tritonclient sends them:
`shared_memory_region`, `shared_memory_byte_size` (required with it), `shared_memory_offset`
(default 0, from the start of the region). `run_request.py` (parsing, the response) and
`launch.py` (the execution) call, each from a small delimited hunk:

- `input_slice` / `output_slice` while parsing the request: the parameters are checked against
  each other, the tensor's datatype and shape, and the region's registration (400 naming the field);
- `pinned` around the execution on the worker thread: the regions are pinned, checked again (they
  may have been unregistered or replaced while the run waited in the queue), region inputs become
  arrays (a system region is copied out with pread when the run starts, then to the GPU on the
  cupy backend; a CUDA region feeds the kernels in place), region outputs are checked against the
  bound output shapes *before* anything runs, and after the run succeeded `commit` copies the
  outputs (staged in the engine's own arrays) into their regions: a failed run changes no byte of
  a region. System regions are never mapped: pread and pwrite see an object the client shrank as
  a short count (a 400), where a mapping's missing pages would kill the server with SIGBUS;
- `response_params` for the response's output entries (they come back without data).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from segfuse.compiler.dtypes import DType

from .errors import bad_request
from .regions import CUDA, Region
from .tensors import kserve_name, nbytes_of

_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


@dataclass(frozen=True)
class RegionSlice:
    name: str  # the region
    offset: int  # from the start of the region
    byte_size: int
    loc: tuple  # the tensor's location: ("inputs", 0) or ("outputs", 1)

    def at(self, key: str) -> list:
        return [*self.loc, "parameters", key]

    @property
    def end(self) -> int:
        return self.offset + self.byte_size


def _slice(params, loc: tuple, what: str) -> RegionSlice | None:
    name = getattr(params, "shared_memory_region", None) if params is not None else None
    size = getattr(params, "shared_memory_byte_size", None) if params is not None else None
    offset = getattr(params, "shared_memory_offset", None) if params is not None else None
    if name is None:
        if size is not None or offset is not None:
            raise bad_request(f"{what} gives shared_memory_byte_size/shared_memory_offset without "
                              "shared_memory_region", [*loc, "parameters", "shared_memory_region"])
        return None
    if size is None:
        raise bad_request(f"{what} names shared_memory_region '{name}' without shared_memory_byte_size "
                          "(required with it)", [*loc, "parameters", "shared_memory_byte_size"])
    return RegionSlice(name, offset or 0, size, tuple(loc))


def _check(region: Region, s: RegionSlice, itemsize: int, what: str) -> None:
    """The slice lies within the registration and is aligned to the dtype's item size."""
    if s.end > region.byte_size:
        key = "shared_memory_offset" if s.offset and s.offset >= region.byte_size else "shared_memory_byte_size"
        raise bad_request(f"{what}: shared_memory_offset {s.offset} + shared_memory_byte_size {s.byte_size} = "
                          f"{s.end} exceeds the {region.byte_size} bytes of region '{region.name}'", s.at(key))
    if (region.offset + s.offset) % itemsize:
        raise bad_request(f"{what}: the tensor would start at byte {region.offset + s.offset} of its memory, which is "
                          f"not a multiple of its item size ({itemsize})", s.at("shared_memory_offset"))


def input_slice(state, inp, loc: tuple, dtype: DType | None, shape: tuple | None) -> RegionSlice | None:
    """parse_request's hook for inputs[i] (at `loc`, with its declared dtype and shape): the region
    slice it reads, or None (then not a region input)."""
    s = _slice(inp.parameters, loc, f"input '{inp.name}'")
    if s is None:
        return None
    p = inp.parameters
    for field, given in (("data", inp.data is not None), ("parameters.binary_data_size", p.binary_data_size is not None),
                         ("parameters.buffer", p.buffer is not None)):
        if given:
            raise bad_request(f"input '{inp.name}' names shared_memory_region '{s.name}' and also gives {field}; "
                              "give one", [*loc, *field.split(".")])
    for field, declared in (("datatype", dtype), ("shape", shape)):
        if declared is None:
            raise bad_request(f"input '{inp.name}' in shared memory needs '{field}'", [*loc, field])
    need = nbytes_of(shape, dtype)
    if s.byte_size != need:
        raise bad_request(f"input '{inp.name}': shared_memory_byte_size is {s.byte_size} but "
                          f"{kserve_name(dtype)}{list(shape)} needs {need} bytes",
                          s.at("shared_memory_byte_size"))
    region = state.regions.find(s.name, None, s.at("shared_memory_region"))
    _check(region, s, dtype.itemsize, f"input '{inp.name}'")
    return s


def output_slice(state, out, loc: tuple, fusion) -> RegionSlice | None:
    """parse_request's hook for outputs[k] (at `loc`): the region slice it is written to, or None. A
    region output is neither stored in a buffer nor returned."""
    s = _slice(out.parameters, loc, f"output '{out.name}'")
    if s is None:
        return None
    p = out.parameters
    for field, given in (("buffer", p.buffer is not None), ("binary_data", bool(p.binary_data)),
                         ("return_data", bool(p.return_data))):
        if given:
            raise bad_request(f"output '{out.name}' goes to shared_memory_region '{s.name}' and also asks for "
                              f"parameters.{field}; an output in shared memory comes back without data",
                              [*loc, "parameters", field])
    region = state.regions.find(s.name, None, s.at("shared_memory_region"))
    _check(region, s, fusion.types[out.name].dtype.itemsize, f"output '{out.name}'")
    return s


def response_params(s: RegionSlice, shape, dtype) -> dict:
    """The response's parameters of an output written to a region: where, and how many bytes."""
    return {"shared_memory_region": s.name, "shared_memory_offset": s.offset,
            "shared_memory_byte_size": math.prod(shape) * dtype.itemsize}


# ---- the run --------------------------------------------------------------------------------------
class _NoRegions:
    inputs: dict = {}

    def commit(self, outputs: dict) -> None:
        pass


NO_REGIONS = _NoRegions()


@contextmanager
def pinned(state, parsed, device_inputs: dict):
    """Around the execution (worker thread): pins the run's regions (of its `ParsedRun`) and yields a
    `RegionRun` (its `inputs` join the engine's inputs; `commit(result.outputs)` after success), or
    NO_REGIONS."""
    ins = [i for i in parsed.inputs if i.region is not None]
    outs = [o for o in parsed.outputs if o.region is not None]
    if not ins and not outs:
        yield NO_REGIONS
        return
    locs = {s.region.name: s.region.at("shared_memory_region") for s in [*ins, *outs]}
    with state.regions.pin(locs, locs.get) as held:
        yield RegionRun(state, parsed, held, ins, outs, device_inputs)


class RegionRun:
    def __init__(self, state, parsed, held: dict[str, Region], ins, outs, device_inputs: dict):
        self.arrays = state.arrays
        self.cp = getattr(state.arrays, "cp", None)
        self.inputs = {}
        for i in ins:
            region, loc = held[i.region.name], i.region.at("shared_memory_region")
            region.check_size(loc)
            _check(region, i.region, i.dtype.itemsize, f"input '{i.name}'")
            if region.kind == CUDA:
                self.inputs[i.name] = self._view(region, i.region, i.dtype, i.shape)
                continue
            host = np.empty(i.shape, self._dtype(i.dtype))
            region.read_into(region.offset + i.region.offset, _bytes_of(host), loc)
            host.flags.writeable = False  # as the mapping's view was: the engine may not write an input
            self.inputs[i.name] = self.arrays.from_host(host) if self.cp else host
        shapes = {i.name: tuple(device_inputs[i.name].shape) if i.name in device_inputs else tuple(i.shape)
                  for i in parsed.inputs}
        types = parsed.fusion.bind(shapes).types  # bound (and dtypes checked) before: the output shapes
        self.outputs = []  # (name, CUDA destination view | system (region, position, dtype, shape, loc))
        taken: list[tuple] = []
        for o in outs:
            region, s, t = held[o.region.name], o.region, types[o.name]
            what = f"output '{o.name}'"
            region.check_size(s.at("shared_memory_region"))
            _check(region, s, t.dtype.itemsize, what)
            need = nbytes_of(tuple(t.shape), t.dtype)
            if s.byte_size < need:
                raise bad_request(f"{what}: shared_memory_byte_size {s.byte_size} is too small for "
                                  f"{kserve_name(t.dtype)}{list(t.shape)} ({need} bytes)", s.at("shared_memory_byte_size"))
            if not region.writable:
                raise bad_request(f"{what}: region '{region.name}' is read-only for the server (its shared memory "
                                  "object could only be opened for reading)", s.at("shared_memory_region"))
            start = region.offset + s.offset
            for other, mem, lo, hi in taken:
                if mem == region.memory and start < hi and lo < start + need:
                    raise bad_request(f"{what} would overwrite the bytes of output '{other}' in shared memory",
                                      s.at("shared_memory_offset"))
            taken.append((o.name, region.memory, start, start + need))
            if region.kind == CUDA:
                self.outputs.append((o.name, self._view(region, s, t.dtype, tuple(t.shape))))
            else:
                loc = s.at("shared_memory_region")
                self.outputs.append((o.name, (region, start, self._dtype(t.dtype), tuple(t.shape), loc)))

    def _dtype(self, dt: DType) -> np.dtype:
        # On the GPU backend bfloat16 lives as its uint16 bits (CuPy has no bfloat16).
        return np.dtype(np.uint16) if self.cp is not None and dt is DType.bfloat16 else dt.np

    def _view(self, region: Region, s: RegionSlice, dt: DType, shape: tuple):
        """A CUDA region's slice as a CuPy array."""
        cuda = self.cp.cuda
        mem = cuda.UnownedMemory(region.mapping, region.byte_size, region, region.device_id)
        return self.cp.ndarray(shape, self._dtype(dt), memptr=cuda.MemoryPointer(mem, s.offset))

    def commit(self, outputs: dict) -> None:
        """After the whole run succeeded: copy each staged output into its region. System objects are
        checked first, all of them, so that one shrunk meanwhile fails the run before any byte is written."""
        if not self.outputs:
            return
        self.arrays.synchronize()  # the engine's stream has finished writing the staged outputs
        for _, dst in self.outputs:
            if isinstance(dst, tuple):
                dst[0].check_size(dst[4])
        for name, dst in self.outputs:
            src = outputs[name]
            if isinstance(dst, tuple):
                region, pos, dtype, shape, loc = dst
                host = self.arrays.to_host(src) if self.cp else src
                region.write_from(pos, _bytes_of(_contiguous(host, dtype, shape)), loc)
            else:
                if self.arrays.may_share(src, dst):  # an output viewing an input in the same memory
                    src = self.arrays.copy(src)
                self.cp.copyto(dst, src)
        self.arrays.synchronize()


def _contiguous(a, dtype: np.dtype, shape: tuple) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == dtype and a.shape == shape and a.flags.c_contiguous:
        return a
    out = np.empty(shape, dtype)
    np.copyto(out, a)  # what copying into a mapping's view did: broadcasting and same-kind casts
    return out


def _bytes_of(a: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array (any dtype: bfloat16 and bool too)."""
    return memoryview(a.reshape(-1).view(np.uint8))

