"""Deferred device errors without a GPU: a graph whose scatter can fail, a stand-in stream for
CuPy, and what a kernel writes into an error block on a bad index."""

from __future__ import annotations

import ctypes

from cupy_standin import fake_cupy
from segfuse.compiler.cuda import thread_state as ts

GRAPH = {"format": "segfuse.fusion/1", "name": "hist",
         "inputs": [{"name": "i", "dtype": "int64", "shape": ["N"]}],
         "ops": [{"op": "full", "out": "z", "inputs": [], "shape": [4], "value": 0, "dtype": "int64"},
                 {"op": "full_like", "out": "one", "inputs": ["i"], "value": 1, "dtype": "int64"},
                 {"op": "scatter", "out": "c", "inputs": ["z", "i", "one"], "dim": 0, "reduce": "add"}],
         "outputs": ["c"]}


class _Stream:
    def __init__(self, non_blocking=False):
        self.syncs = 0

    def synchronize(self):
        self.syncs += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _fake_cupy():
    return fake_cupy(_Stream)


def _fail(state, slot_ptr: int, op_index: int, value: int):
    """What a kernel does on a bad index: claim word 0 (the code), then fill the rest."""
    words = (ctypes.c_int64 * ts.ERR_WORDS).from_address(slot_ptr)
    words[0], words[1], words[2], words[3], words[4] = 1, op_index, value, 0, 4
