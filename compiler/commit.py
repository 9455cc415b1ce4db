"""The one commit rule of the backends that execute plans (the NumPy plan executor and CuPy).

A run's results are committed only once the whole run succeeded (or was launched, when it cannot
fail or defers its errors), following the plan's `Commit` of each graph output:
1. outputs marked `copy` (an input, a view of one, a broadcast view) are copied first, before any
   input is written, so `reshape(x)` keeps x's old value when another output updates x;
2. an output declaring `alias_of` is written into that input, and the input is returned;
3. every other output is returned as it is.
Backends differ only in how they copy and write arrays (`copy(v)`, `write(commit, v)`).
The op-by-op NumPy interpreter (numpy_backend.run_graph) keeps a rule of its own on purpose: it
is the oracle the plan backends are tested against.
"""

from __future__ import annotations

from collections.abc import Callable

from .plan import Commit


def commit(commits: tuple[Commit, ...] | list[Commit], values: dict, copy: Callable, write: Callable) -> dict:
    """{output name: the array returned} for `values` (tensor name -> the run's array)."""
    held = {c.name: copy(values[c.name]) for c in commits if c.copy}
    res = {}
    for c in commits:
        v = held[c.name] if c.copy else values[c.name]
        res[c.name] = v if c.alias_of is None else write(c, v)
    return res
