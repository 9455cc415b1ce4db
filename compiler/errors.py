"""Errors that carry a location in the user's graph or request, so messages can name the field."""

from __future__ import annotations

from dataclasses import dataclass

Loc = tuple  # ("ops", 3, "inputs", 1)


def format_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


@dataclass(frozen=True)
class Issue:
    loc: Loc
    msg: str

    def __str__(self) -> str:
        where = format_loc(self.loc)
        return f"{where}: {self.msg}" if where else self.msg

    def to_dict(self) -> dict:
        return {"loc": list(self.loc), "msg": self.msg}


class SegfuseError(Exception):
    """Base class of every error segfuse raises on purpose."""

    def __init__(self, issues: list[Issue] | str, loc: Loc = ()):
        if isinstance(issues, str):
            issues = [Issue(tuple(loc), issues)]
        self.issues: list[Issue] = list(issues)
        super().__init__("; ".join(str(i) for i in self.issues))

    def details(self) -> list[dict]:
        return [i.to_dict() for i in self.issues]


class GraphError(SegfuseError):
    """The graph is invalid (found before running)."""


class BindError(SegfuseError):
    """Run-time inputs disagree with the graph (missing input, dtype, shape, symbol values)."""


class RunError(SegfuseError):
    """The data made the run fail (index out of range, integer division by zero, ...).

    No output and no aliased input was changed.
    """


class DeferredRunError(RunError):
    """An earlier run with deferred errors (`Engine(errors="deferred")`) failed; raised by a later
    call on the same thread or by `Engine.synchronize()`, as CUDA reports asynchronous errors.

    The failed run's outputs hold unspecified values (the bad writes were skipped); no input was
    changed, because runs that update inputs in place are always checked before they return.
    `later_failures` counts other pending runs that failed too.
    """

    later_failures: int = 0


class OpError(Exception):
    """Raised by an op's shape/dtype rule; the validator adds the op's location.

    `where` is a location suffix inside the op, e.g. ("inputs", 1) or ("dim",).
    """

    def __init__(self, msg: str, where: Loc = ()):
        super().__init__(msg)
        self.msg = msg
        self.where = tuple(where)
