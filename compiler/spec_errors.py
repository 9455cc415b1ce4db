"""Validation messages from pydantic's errors: one issue per place, named by its location, with a
"did you mean" where a close name or value exists (difflib) or where the given value is PyTorch's
name for a segfuse one (an attribute model's `synonyms`)."""

from __future__ import annotations

import difflib
import re

import pydantic

from .errors import Issue
from .ops.registry import TORCH_DTYPE_NAMES
from .schema import GraphSpec, InputSpec, OpSpec, OutputSpec


def did_you_mean(word, candidates, synonyms: dict | None = None) -> str:
    """"; did you mean 'x'?" for the candidates close to `word` (difflib), or for what `synonyms`
    says it means (PyTorch's "sum" for segfuse's "add"); "" when none is close."""
    if not isinstance(word, str):
        return ""
    cands = list(dict.fromkeys(candidates))
    meant = (synonyms or {}).get(word.lower())
    close = [meant] if meant in cands else difflib.get_close_matches(word, cands, n=3)
    close.sort(key=lambda c: not c.startswith(word[:1]))  # 'ad': 'add' before 'pad'
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def _value_hint(err: dict, synonyms: dict) -> str:
    """A "did you mean" for a value outside an attribute's allowed set (a Literal or an enum)."""
    if err["type"] not in ("literal_error", "enum") or not err["loc"]:
        return ""
    allowed = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
    return did_you_mean(err.get("input"), allowed, synonyms.get(err["loc"][-1]))


def pydantic_issues(e: pydantic.ValidationError, prefix: tuple = (), fields=None,
                    synonyms: dict | None = None) -> list[Issue]:
    """Issues of a pydantic error, one per place. `fields(loc)`: the field names allowed where an
    unknown field is (for a "did you mean"); `synonyms`: per field, other names of its values."""
    out = []
    for err in e.errors():
        loc = prefix + tuple(p for p in err["loc"] if not (isinstance(p, str) and ("[" in p or p in (
            "str", "int", "float", "bool", "list[str]", "constrained-str", "OutputSpec")) ))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field" + (did_you_mean(loc[-1], fields(loc)) if fields and loc else "")
        elif err["type"] == "missing":
            msg = "field required"
        else:
            msg += _value_hint(err, synonyms or {"dtype": TORCH_DTYPE_NAMES})
        out.append(Issue(loc, msg))
    # one issue per place: the branches of a union (int | list[int], name | number) are merged
    merged: dict[tuple, list[str]] = {}
    for i in out:
        msgs = merged.setdefault(i.loc, [])
        if i.msg not in msgs:
            msgs.append(i.msg)
    uniq = []
    for loc, msgs in merged.items():
        if len(loc) == 4 and loc[0] == "ops" and loc[2] == "inputs" and isinstance(loc[3], int) and len(msgs) > 1:
            msg = "an operand must be a tensor name or a number literal"
        else:
            msg = msgs[0] + "".join(", or " + m.removeprefix("Input should be ") for m in msgs[1:])
        uniq.append(Issue(loc, msg))
    return uniq


def spec_fields(loc: tuple) -> list[str]:
    """The fields allowed where a graph has an unknown field (loc: where that field is)."""
    where = tuple(p for p in loc[:-1] if isinstance(p, str))
    model = {(): GraphSpec, ("inputs",): InputSpec, ("outputs",): OutputSpec, ("ops",): OpSpec}.get(where)
    return list(model.model_fields) if model else []
